"""Where a command writes: checked before it runs, so that a run is never lost to an
output path that cannot be written (a folder that is a file, a file that is a folder, a
read-only place)."""

from __future__ import annotations

import functools
import json
import os
import stat
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from contextvars import ContextVar
from pathlib import Path

from .errors import ConfigError


def _first_existing(p: Path) -> Path:
    """`p` or its nearest ancestor that exists."""
    p = p.absolute()
    while not p.exists() and p.parent != p:
        p = p.parent
    return p


def check_path_type(path, what: str = "output folder") -> None:
    """A path must be a string or a path object (`5`, `None`: a ConfigError, not Path's TypeError)."""
    if not isinstance(path, (str, os.PathLike)):
        raise ConfigError(f"{what} must be a folder's path (a string or a Path), got {path!r:.60}")


def _check_named_folder(path, what: str) -> None:
    """A folder's path, given and not '' (the current folder is written only when named '.')."""
    check_path_type(path, what)
    if str(path) == "":
        raise ConfigError(f"{what} must name a folder")


def _broken_link(p: Path) -> Path | None:
    """`p` or the nearest of its ancestors that is a symbolic link to nothing, before one
    that exists; None when there is none."""
    p = p.absolute()
    while not p.exists() and p.parent != p:
        if p.is_symlink():
            return p
        p = p.parent
    return None


def _check_folder(given, folder: Path, what: str) -> None:
    """`folder` (or the place it will be made in) can hold new files."""
    # a link to nothing passed for a folder yet to be made, which mkdir then refused with
    # a bare "File exists"
    link = _broken_link(folder)
    if link is not None:
        where = "" if link == Path(given).absolute() else f": {link}"
        raise ConfigError(f"{what} {str(given)!r}{where} is a broken symbolic link (to {os.readlink(link)!r})")
    base = _first_existing(folder)
    if not base.is_dir():
        if base == Path(given).absolute():
            raise ConfigError(f"{what} {str(given)!r} is a file, not a folder")
        raise ConfigError(f"{what} {str(given)!r}: {base} is a file, not a folder")
    if not os.access(base, os.W_OK | os.X_OK):
        raise ConfigError(f"{what} {str(given)!r}: {base} is not writable")
    # os.access says yes to root everywhere (/sys, /proc): make and drop a file to be sure
    # (not tempfile: it imports shutil, a start-up cost of every run)
    probe = base / f".llmsched-probe-{os.getpid()}"
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT, 0o600))
    except OSError as e:
        raise ConfigError(f"{what} {str(given)!r}: cannot write in {base} ({e.strerror})") from None
    probe.unlink(missing_ok=True)


# the kinds of `llmsched simulate` run: one replaces another in a folder (a rerun with
# another flag); a sweep or a `reproduce` experiment is a kind of its own
SIMULATE_KINDS = ("network", "serverless", "single-server")

_TABLE = ("table.csv", "table.parquet")
# a single-server run's Parquet tables (`SimResult.write_parquet` writes TABLE.parquet)
# and the figures `llmsched plot` draws into its folder
PARQUET_TABLES = ("requests", "timeseries", "steps")
STALE_FIGURES = ("queue.png", "ttft_cdf.png", "itl_cdf.png", "token_load.png")
# what each kind of run writes at the top of its folder (a simulate run's summary.json
# and config.json besides, which any of them replaces)
RUN_OUTPUTS = {
    "single-server": (
        "requests.csv",
        "timeseries.csv",
        "itl_histogram.csv",
        "load_histogram.csv",
        "batch_histogram.csv",
        "steps.csv",
        *(f"{t}.parquet" for t in PARQUET_TABLES),
        *STALE_FIGURES,
    ),
    "network": ("calls.csv", "jobs.csv", "servers"),
    "serverless": ("requests.csv", "instances.csv"),
    "sweep": (
        "points",
        "results.csv",
        "results.parquet",
        "search.csv",
        "search.parquet",
        "search.json",
        "throughput.png",
        "latency.png",
        "max_stable_rate.png",
    ),
    "reproduce stability": ("queue.png", "search", *_TABLE, "table.json"),
    "reproduce prefix-caching": (*_TABLE, "result.json"),
    "reproduce twp": (
        *(f"{t}.{x}" for t in ("table", "table3", "ablation", "slo", "stability") for x in ("csv", "parquet")),
        *(f"{f}.png" for f in ("ttft", "itl_cdf", "tpot_box", "throughput", "itl_cv", "ablation", "stability")),
        "result.json",
    ),
    "reproduce clusters": ("clusters_p99.png", "clusters_ttft.png", *_TABLE, "table.json"),
    "reproduce agents": ("agents_backlog.png", "agents_backlog.csv", *_TABLE, "table.json"),
    "reproduce rybko-stolyar": (
        "rybko_stolyar_backlog.png",
        "rybko_stolyar_backlog.csv",
        "rybko_stolyar_loads.png",
        "loads.csv",
        "loads.parquet",
        *_TABLE,
        "table.json",
    ),
}

# what proves that a folder holds an earlier run of a kind (a file name a run writes is no
# proof alone: the user's own results.csv, requests.csv or table.csv): (file or folder,
# written first). One written before any other output (a sweep's points) is missing only
# from a folder that holds none of the run's outputs; one written last (a simulate run's
# summary.json, an experiment's table.json or result.json) is missing from a run that
# stopped before it too, whose files are then no proof of a run either: a folder holding
# any file a run writes is taken only with the run's proof (or, for a simulate run that
# stopped while writing, its `INCOMPLETE_MARK`)
_SIMULATE_PROOF = "summary.json"
RUN_PROOFS = {
    **dict.fromkeys(SIMULATE_KINDS, (_SIMULATE_PROOF, False)),
    "sweep": ("points", True),
    **{kind: ("table.json", False) for kind, outputs in RUN_OUTPUTS.items() if "table.json" in outputs},
    "reproduce twp": ("result.json", False),
    "reproduce prefix-caching": ("result.json", False),
}
# what proves an experiment's folder of a run that stopped before its proof (interrupted,
# Ctrl-C): a stability run's search/points/, the probes' records, which its search writes
# before any of its other files (queue.png comes after the search); checked as a sweep's
# points/ are (only records of points, `_proof_flaw`), so that a rerun resumes the search
RESUME_PROOFS = {"reproduce stability": "search/points"}

# a run's folder while the run writes its files (`begin_simulate_write`,
# `begin_reproduce_write`, `begin_sweep_write`): made before any file of an earlier run
# there is removed, removed once the run's last file (`LAST_FILES`: a simulate run's
# summary.json, an experiment's table.json or result.json, its proof; a sweep's
# results.csv), written last, is in place. A folder holding it and not that file is a
# run's that stopped while writing (Ctrl-C, a kill, a full disk), as is one whose mark was
# written while the earlier run's files stay (a stability run's search, `EARLIER_KEPT`,
# its earlier table.json there): never taken for a finished run (`plot` refuses it, as
# does a run of another kind), and a rerun of its kind replaces it as it replaces a
# finished run
INCOMPLETE_MARK = ".llmsched-incomplete"
# the kinds of run that mark their folder while writing (a sweep marks it after its runs,
# when it writes its tables and figures: its points/, written first, stay for a rerun to
# resume)
REPRODUCE_KINDS = tuple(k for k in RUN_OUTPUTS if k.startswith("reproduce "))
MARKED_KINDS = (*SIMULATE_KINDS, *REPRODUCE_KINDS, "sweep")
# the file each marked kind writes last (its proof, but for a sweep, whose proof, points/,
# comes first): the mark without it is a run that stopped while writing
LAST_FILES = {**{k: RUN_PROOFS[k][0] for k in MARKED_KINDS if k != "sweep"}, "sweep": "results.csv"}

# what a proof holds when a run wrote it (a user's own summary.json or table.json, JSON of
# another tool, is no proof): the keys every such file has; a sweep's points/ holds only
# its points' records, KEY.json files of these keys
_PROOF_KEYS = {
    _SIMULATE_PROOF: ("duration", "steps", "wall_s"),
    "table.json": ("meta", "rows"),
    "result.json": ("config", "rows"),
}
_POINT_KEYS = ("key", "config", "summary")

# the folders a run makes among its outputs, and what it writes in them: a sweep's
# points/ (one KEY.json per point), a stability run's search/ (a sweep's folder), a
# network's servers/ (a single-server folder per replica); a run clears such a folder of
# an earlier run only when it holds nothing else (`check_run_dir`, `clear_stale`). What
# proves an entry a run's is its content, never its name alone: a point's record (a JSON
# object of `_POINT_KEYS`, its key its file's name), a replica's folder (a summary.json
# that proves a simulate run, `_PROOF_KEYS`)
_REPLICA_FILES = frozenset({_SIMULATE_PROOF, "config.json", *RUN_OUTPUTS["single-server"]})
RUN_FOLDERS = ("points", "search", "servers")


def _own_entry(layout: str, path: Path, is_dir: bool) -> str | None:
    """What a run writes as `path` inside a folder of `layout` (`RUN_FOLDERS`, or a
    network's replica): "file", the layout of a folder, or None when no run wrote it (as
    far as llmsched can prove: a points/ JSON that is no point's record, a servers/
    folder without a replica's summary.json, are the user's)."""
    name = path.name
    if layout == "points":
        return "file" if not is_dir and name.endswith(".json") and _record_ok(path) else None
    if layout == "servers":
        return "replica" if is_dir and is_replica_folder(path) else None
    if layout == "replica":
        return "file" if not is_dir and name in _REPLICA_FILES else None
    # search: a sweep's folder
    if name == "points":
        return "points" if is_dir else None
    return "file" if not is_dir and name in RUN_OUTPUTS["sweep"] else None


def is_replica_folder(path) -> bool:
    """Whether `path` is a folder a network run wrote for one of its replicas
    (servers/NAME/): its summary.json is a simulate run's (`_PROOF_KEYS`), not merely a
    file of that name (a user's servers/my_notes/summary.json), or it is a replica's that
    stopped while writing (`is_interrupted_run`)."""
    p = Path(path)
    proof = p / _SIMULATE_PROOF
    if not p.is_dir() or p.is_symlink():
        return False
    return (not proof.is_symlink() and _proof_flaw(proof) is None) or is_interrupted_run(p, SIMULATE_KINDS)


# an `INCOMPLETE_MARK`'s phase while the run's earlier files are still in place (a
# stability run's search, `mark_reproduce_search`): the folder is an unfinished run's
# whether or not the earlier run's last file is there
EARLIER_KEPT = "earlier-kept"


def _mark(path: Path) -> tuple[str, str | None] | None:
    """(the kind of run, `MARKED_KINDS`, that wrote `path`, an `INCOMPLETE_MARK` (not a
    link, its content the run's); its phase or None); None when no run wrote it."""
    if path.is_symlink() or not path.is_file():
        return None
    value = _json_object(path)
    kind = None if value is None else value.get("incomplete")
    if not (isinstance(kind, str) and kind in MARKED_KINDS):
        return None
    phase = value.get("phase")
    return kind, phase if isinstance(phase, str) else None


def _write_mark(out: Path, kind: str, phase: str | None = None) -> None:
    """`out`'s `INCOMPLETE_MARK`: a run of `kind` is writing there (in `phase`)."""
    mark = {"incomplete": kind} if phase is None else {"incomplete": kind, "phase": phase}
    atomic_write(out / INCOMPLETE_MARK, lambda p: p.write_text(json.dumps(mark) + "\n"))


# the folders whose run's last file this process has written (`_end_write`,
# `end_sweep_write`): a Ctrl-C after that interrupts only what the command prints (`cli`)
FINISHED_FOLDERS: set[str] = set()


def _end_write(out: Path, last: str, write_last) -> str:
    """`write_last(path)` writes the run's last file, `last` in `out`, whole
    (`atomic_write`); then the folder's `INCOMPLETE_MARK` goes. Returns its path."""
    path = out / last
    atomic_write(path, write_last)
    (out / INCOMPLETE_MARK).unlink(missing_ok=True)
    FINISHED_FOLDERS.add(os.path.realpath(out))
    return str(path)


def interrupted_kind(folder) -> str | None:
    """The kind of run that stopped while writing its files in `folder`: its
    `INCOMPLETE_MARK` and not the file it writes last (`LAST_FILES`), or its mark written
    while the earlier run's files were kept (`EARLIER_KEPT`: a stability run stopped in its
    search, the earlier run's table.json still there); None when there is none."""
    d = Path(folder)
    mark = _mark(d / INCOMPLETE_MARK)
    if mark is None:
        return None
    kind, phase = mark
    if phase == EARLIER_KEPT:
        return kind
    last = d / LAST_FILES[kind]
    return None if last.exists() or last.is_symlink() else kind


# the search/ a `reproduce stability` run writes now (`writing_stability_search`): any
# other sweep into a stability run's search/ is refused (`check_run_dir`)
_STABILITY_SEARCH: ContextVar[str | None] = ContextVar("stability_search", default=None)


@contextmanager
def writing_stability_search(folder) -> Iterator[None]:
    """While a `reproduce stability` run's own rate search writes into `folder` (its search/)."""
    token = _STABILITY_SEARCH.set(os.path.realpath(folder))
    try:
        yield
    finally:
        _STABILITY_SEARCH.reset(token)


@contextmanager
def held_alone(folder, who: str, what: str = "output folder") -> Iterator[None]:
    """Hold `folder` (made already) for one run of `who` at a time: another that tries
    while it is held is refused (ConfigError) rather than mixing its files with this
    one's. An advisory lock on the folder itself (flock: it ends with its process, so a
    killed run leaves nothing to clean up); where locks are not to be had (no fcntl, a
    file system that refuses them, a folder that cannot be opened for reading) the run goes
    on unguarded, as before."""
    try:
        import fcntl  # noqa: PLC0415 (not on Windows)

        fd = os.open(folder, os.O_RDONLY)
    except (ImportError, OSError):
        fd = None
    if fd is None:
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConfigError(
                f"{what} {str(folder)!r} is being written by another {who} running now: wait for it to "
                "finish, or choose another folder"
            ) from None
        except OSError:
            pass
        yield
    finally:
        os.close(fd)


# inside a `writes_alone` call: [its ExitStack, who it is, whether it holds its folder yet]
_WRITER: ContextVar[list | None] = ContextVar("writer", default=None)


def writes_alone(who: str):
    """A decorator for a function that writes one output folder (a `reproduce` experiment,
    a result's `write`): the first folder it makes (`make_run_dir`) is held by it alone
    (`held_alone`) until it returns, so that a second run of `who` into that folder is
    refused (ConfigError) rather than mixing its files with this one's. A call inside
    another (a write within an experiment) holds nothing more."""

    def wrap(func):
        @functools.wraps(func)
        def call(*args, **kwargs):
            if _WRITER.get() is not None:
                return func(*args, **kwargs)
            with ExitStack() as stack:
                token = _WRITER.set([stack, who, False])
                try:
                    return func(*args, **kwargs)
                finally:
                    _WRITER.reset(token)

        return call

    return wrap


def make_run_dir(path) -> Path:
    """Make the folder `path` (checked already) and, inside a `writes_alone` call, hold it."""
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    writer = _WRITER.get()
    if writer is not None and not writer[2]:
        writer[0].enter_context(held_alone(out, writer[1]))
        writer[2] = True
    return out


def stability_run_of_search(folder) -> Path | None:
    """The folder of the `reproduce stability` run whose search/ `folder` is (a finished
    run's table.json beside it, or the run's mark: running, or stopped), else None."""
    d = Path(os.path.realpath(folder))
    if d.name != "search":
        return None
    parent = d.parent
    if (_mark(parent / INCOMPLETE_MARK) or (None,))[0] == "reproduce stability":
        return parent
    table = parent / "table.json"
    if run_kind(parent) == "reproduce stability" and not table.is_symlink() and _proof_flaw(table) is None:
        return parent
    return None


def is_interrupted_run(folder, kinds=SIMULATE_KINDS) -> bool:
    """Whether `folder` holds a run of one of `kinds` (default: a simulate run) that
    stopped while writing its files: its `INCOMPLETE_MARK` and not its last file
    (summary.json, table.json, result.json, results.csv: `LAST_FILES`)."""
    return interrupted_kind(folder) in kinds


def interrupted_message(folder) -> str | None:
    """The line that refuses to read `folder` when a run stopped while writing its files
    there (`interrupted_kind`), naming the folder and saying to rerun; None otherwise."""
    kind = interrupted_kind(folder)
    if kind is None:
        net = Path(os.path.realpath(folder)).parent  # (through a link, or `servers/s1/../s1`)
        if net.name == "servers" and interrupted_kind(net.parent) == "network":
            # a replica's files may be whole, but of a run that did not finish (the
            # network's refusal points to a replica's folder)
            return (
                f"{folder} is a replica's folder of a network run in {net.parent} that stopped while "
                f"writing its files ({INCOMPLETE_MARK} there): its files are not one finished run's; "
                "rerun the network run"
            )
        return None
    d = Path(folder)
    proof = LAST_FILES[kind]
    if _mark(d / INCOMPLETE_MARK) == (kind, EARLIER_KEPT):
        return (
            f"{folder} holds a `llmsched {kind}` run that stopped before writing its files "
            f"({INCOMPLETE_MARK}; a {proof} there is an earlier run's, which the new run's search "
            "has begun to replace): its files are not one finished run's; rerun it"
        )
    who = "a run" if kind in SIMULATE_KINDS else f"a `llmsched {kind}` run"
    rerun = "rerun it"
    parent = (_mark(d.absolute().parent / INCOMPLETE_MARK) or (None,))[0]
    if kind == "sweep" and d.name == "search" and parent == "reproduce stability":
        # a stability run's search (`reproduce_stability`), stopped while writing its tables
        who = f"the search of a `llmsched {parent}` run"
        rerun = f"rerun the `llmsched {parent}` run in {d.parent}"
    return (
        f"{folder} holds {who} that stopped while writing its files ({INCOMPLETE_MARK}, no {proof}, "
        f"which a run writes last): its files are not one finished run's; {rerun}"
    )


def begin_simulate_write(out, kind: str, keep=None) -> None:
    """Before a simulate run of `kind` writes its files into `out` (checked, `check_run_dir`):
    mark the folder as being written (`INCOMPLETE_MARK`), then remove the earlier run's
    summary.json (its proof), its other files (any simulate kind's, config.json, a
    network's replica folders: never a file no run writes) and the temporary files of a
    write that stopped. A run that stops before `end_simulate_write` leaves a folder that
    no one takes for a finished run, never one that mixes two runs' files. `keep`: a file
    of this run's already in the folder (its recorded steps), left where it is."""
    out = Path(out)

    def kept(p: Path) -> bool:
        try:
            return keep is not None and os.path.samefile(p, keep)
        except OSError:
            return False

    _write_mark(out, kind)
    (out / _SIMULATE_PROOF).unlink(missing_ok=True)
    for e in list(os.scandir(out)):
        if _temporary(e.name) and e.is_file(follow_symlinks=False) and not kept(Path(e.path)):
            os.unlink(e.path)
    for name in dict.fromkeys(("config.json", *(n for k in SIMULATE_KINDS for n in RUN_OUTPUTS[k]))):
        p = out / name
        if name in RUN_FOLDERS:
            if p.is_dir() and not p.is_symlink():
                remove_run_folder(p, name)
        elif (p.is_file() or p.is_symlink()) and not kept(p):
            p.unlink()


def _replaced_names(kind: str) -> set[str]:
    """The names at the top of its folder that a `kind` run writes or removes
    (`begin_simulate_write`, `begin_reproduce_write`, `begin_sweep_write`)."""
    if kind in SIMULATE_KINDS:
        names = {_SIMULATE_PROOF, "config.json", *(n for k in SIMULATE_KINDS for n in RUN_OUTPUTS[k])}
    else:
        names = set(RUN_OUTPUTS[kind])
    return names | {INCOMPLETE_MARK, *((LAST_FILES[kind],) if kind in LAST_FILES else ())}


def _replaced(out: Path, names: set[str], parts: tuple[str, ...]) -> bool:
    """Whether `out`/`parts` is a file a run that writes `names` into `out` replaces or
    removes: one of them, a write's temporary file, or inside one of its folders
    (`RUN_FOLDERS`) a file a run writes there (`_own_entry`: the user's files stay)."""
    if len(parts) == 1:
        return parts[0] in names or _temporary(parts[0])
    if parts[0] not in names or parts[0] not in RUN_FOLDERS:
        return False
    layout, path = parts[0], out / parts[0]
    for i, part in enumerate(parts[1:], 2):
        path = path / part
        layout = _own_entry(layout, path, i < len(parts))
        if layout is None:
            return False
    return layout == "file"


def _shown(p: Path) -> str:
    """`p` relative to the current folder when under it, as a user types it."""
    try:
        return os.path.relpath(p) if p.is_relative_to(Path.cwd()) else str(p)
    except OSError:  # (no current folder)
        return str(p)


def check_inputs_kept(out_dir, kind: str, inputs, what: str = "output folder") -> None:
    """Refuse (ConfigError) a `kind` run into `out_dir` that reads one of `inputs` (the
    files its configuration names: a trace, a `replay:` or `empirical:` table, a profile)
    from a file the run replaces or removes there (its requests.csv, a stale
    requests.parquet): the run would destroy what it read, and its config.json would
    name a file that no longer holds it. Inputs under other names stay beside its files."""
    out = Path(out_dir)
    if not out.is_dir():
        return  # (a folder the run makes holds no input)
    names = _replaced_names(kind)
    for given in inputs:
        if not isinstance(given, (str, os.PathLike)):
            continue  # (not a file's name: the reader that takes it says what is wrong)
        p = Path(os.path.abspath(os.path.expanduser(given)))
        # the name it is read by (removed and written anew), and the file a link there names
        for loc in (Path(os.path.realpath(p.parent)) / p.name, Path(os.path.realpath(p))):
            # (samefile, not the path's text: a folder reached by a link or a bind mount)
            for depth, top in enumerate(loc.parents, 1):
                try:
                    same = os.path.samefile(top, out)
                except OSError:
                    continue
                if same and _replaced(out, names, loc.parts[-depth:]):
                    shown = _shown(p)
                    raise ConfigError(
                        f"{shown} is a file this run reads and would replace in {what} {str(out_dir)!r} "
                        f"(as its {'/'.join(loc.parts[-depth:])}): copy it elsewhere or choose another folder"
                    )
                if same:
                    break


def mark_reproduce_search(out, kind: str) -> None:
    """Before a `reproduce` experiment of `kind` writes into a folder of its own in `out`
    (a stability run's search, into search/, which may run for hours): mark `out`
    (`INCOMPLETE_MARK`, phase `EARLIER_KEPT`) and remove nothing. An earlier run's files
    stay in place until `begin_reproduce_write`, after the search: a run stopped in its
    search (Ctrl-C) loses none of them, and leaves a folder no one takes for a finished
    run (its search/ is no longer the earlier run's alone), which a rerun resumes."""
    _write_mark(Path(out), kind, EARLIER_KEPT)


def begin_reproduce_write(out, kind: str, keep=()) -> None:
    """Before a `reproduce` experiment of `kind` writes its first file into `out` (checked
    and made, `prepare_run_dir`): mark the folder as being written (`INCOMPLETE_MARK`), then
    remove the earlier run's proof (table.json or result.json), the other files of `kind`
    (`RUN_OUTPUTS`: never a file no run writes, `remove_run_folder` for a folder) and the
    temporary files of a write that stopped. A run that stops before
    `end_reproduce_write` leaves a marked folder that no one takes for a finished run,
    never the new run's table beside the earlier run's figures or proof. `keep`: paths
    (relative to `out`, inside a `RUN_FOLDERS` folder) left in place, records the new run
    reuses (a stability run's search/points/, each record a probe's, keyed by its
    configuration; a sweep's points/, `begin_sweep_write`)."""
    out = Path(out)
    keep = {Path(k) for k in keep}
    _write_mark(out, kind)
    (out / LAST_FILES[kind]).unlink(missing_ok=True)
    remove_temporary_files(out)
    for name in RUN_OUTPUTS[kind]:
        p = out / name
        if Path(name) in keep:  # (a whole folder kept: a sweep's points/)
            continue
        if name in RUN_FOLDERS:
            if p.is_dir() and not p.is_symlink():
                kept = {k.relative_to(name) for k in keep if k.parts[:1] == (name,) and len(k.parts) > 1}
                remove_run_folder(p, name, keep={k.parts[0] for k in kept if len(k.parts) == 1})
        elif p.is_file() or p.is_symlink():
            p.unlink()


def end_reproduce_write(out, kind: str, write_proof) -> str:
    """After a `reproduce` experiment wrote its other files into `out`
    (`begin_reproduce_write`): `write_proof(path)` writes its proof (table.json or
    result.json) whole (`atomic_write`), last; then the folder's `INCOMPLETE_MARK` goes.
    Returns the proof's path."""
    return _end_write(Path(out), LAST_FILES[kind], write_proof)


def begin_sweep_write(out) -> None:
    """After a sweep's runs, before it writes its tables and figures into `out`: mark the
    folder (`INCOMPLETE_MARK`), remove the earlier run's results.csv (which a sweep writes
    last), its other tables and figures (`RUN_OUTPUTS`, only names a sweep writes) and the
    temporary files of a write that stopped; its points/ stay, this run's records among
    them (a rerun resumes from them). `end_sweep_write` removes the mark once results.csv
    is in place: a sweep that stops in between leaves a marked folder, never its new
    results.csv beside an earlier run's search.csv or figures."""
    begin_reproduce_write(out, "sweep", keep=("points",))


def end_sweep_write(out) -> None:
    """After a sweep wrote results.csv, its last file (`begin_sweep_write`): the folder's
    `INCOMPLETE_MARK` goes."""
    (Path(out) / INCOMPLETE_MARK).unlink(missing_ok=True)
    FINISHED_FOLDERS.add(os.path.realpath(out))


def end_simulate_write(out, write_summary) -> None:
    """After a simulate run wrote its other files into `out` (`begin_simulate_write`):
    `write_summary(path)` writes summary.json whole (`atomic_write`), the run's proof,
    written last; then the folder's `INCOMPLETE_MARK` goes."""
    _end_write(Path(out), _SIMULATE_PROOF, write_summary)


def _unproven_replica(servers: Path) -> str | None:
    """The first file (a path relative to `servers`) in a network's servers/ that bears the
    name of a replica's file in a folder that is no replica's (`is_replica_folder`): a
    network run writing a replica of that name would replace it, so the run is refused;
    None when there is none (a folder of other files only is left as it is)."""
    for e in sorted(os.scandir(servers), key=lambda e: e.name):
        if e.name.startswith(".") or not e.is_dir(follow_symlinks=False) or is_replica_folder(e.path):
            continue
        for f in sorted(os.scandir(e.path), key=lambda f: f.name):
            if f.name in _REPLICA_FILES:
                return f"{e.name}/{f.name}"
    return None


def _temporary(name: str) -> bool:
    """A write's temporary file (.NAME.tmp, .NAME.PID.tmp), left by a run that stopped."""
    return name.startswith(".") and name.endswith(".tmp")


def remove_temporary_files(folder) -> None:
    """Remove the temporary files (`_temporary`) that writes into `folder` left when their
    run was killed (a kill -9 runs no clean-up): a run clears them before it writes there."""
    for e in list(os.scandir(folder)):
        if _temporary(e.name) and e.is_file(follow_symlinks=False):
            os.unlink(e.path)


def _entries(folder: Path, layout: str):
    """(entry, what a run writes it as) for each entry of a run's folder of `layout`, hidden
    ones left out: "file", the layout of a folder a run writes, or None (no run writes it,
    or it is a link)."""
    for e in sorted(os.scandir(folder), key=lambda e: e.name):
        if not e.name.startswith("."):
            is_dir = e.is_dir(follow_symlinks=False)
            yield e, None if e.is_symlink() else _own_entry(layout, Path(e.path), is_dir)


def _strays(folder: Path, layout: str) -> list[str]:
    """The files (paths relative to `folder`) inside a run's folder of `layout` that no
    run writes there (hidden files other than a write's temporary ones are not counted:
    they stay, as beside a run's outputs)."""
    out = []
    for e, own in _entries(folder, layout):
        if own is None:
            out.append(e.name)
        elif own != "file":
            out += [f"{e.name}/{n}" for n in _strays(Path(e.path), own)]
    return out


def remove_run_folder(folder, layout: str, keep=()) -> None:
    """Remove what a run writes inside `folder` (of `layout`: one of `RUN_FOLDERS`, or
    "replica", a network's servers/NAME/), and the folder when that leaves it empty:
    never a file no run writes there (`_strays`). `keep`: names of entries left as they are."""
    folder = Path(folder)
    for e in list(os.scandir(folder)):
        if (_temporary(e.name) or e.name == INCOMPLETE_MARK) and e.is_file(follow_symlinks=False):
            os.unlink(e.path)
    for e, own in list(_entries(folder, layout)):
        if e.name in keep:
            continue
        if own == "file":
            os.unlink(e.path)
        elif own is not None:
            remove_run_folder(Path(e.path), own)
    try:
        folder.rmdir()
    except OSError:  # something stays in it (a file no run writes, a hidden file)
        pass


def _json_object(path: Path) -> dict | None:
    try:
        value = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _proof_flaw(path: Path) -> str | None:
    """Why `path`, named as a run's proof (`RUN_PROOFS`), is not what the run writes there;
    None when it is."""
    if path.name == "points":
        if not path.is_dir():
            return "not a folder"
        records = sorted(e.name for e in os.scandir(path) if not e.name.startswith("."))
        stray = next((n for n in records if not n.endswith(".json")), None)
        if stray is not None:
            return f"{stray!r} in it is not a point's record"
        # one good record proves the folder (a damaged one is simulated again on resume)
        if records and not any(_record_ok(path / n) for n in records):
            return "none of its files is a point's record"
        return None
    if not path.is_file():
        return "not a file"
    value = _json_object(path)
    if value is None:
        return "not a JSON object"
    missing = [k for k in _PROOF_KEYS[path.name] if k not in value]
    return f"no {missing[0]!r} key" if missing else None


def read_point_record(path) -> dict | None:
    """The point's record at `path` (a sweep's points/KEY.json): a JSON object holding
    `_POINT_KEYS`, its key its file's name (a record copied over another point's file is
    not that point's); None when the file is no such record (or cannot be read)."""
    path = Path(path)
    record = _json_object(path)
    if record is None or not all(k in record for k in _POINT_KEYS) or record["key"] != path.stem:
        return None
    return record


def _record_ok(path: Path) -> bool:
    return read_point_record(path) is not None


# a file (or folder) only one kind of run writes at the top of its folder, in the order
# they are looked for (a twp run's result.json beside its table3.csv; a simulate run's
# queue.png, drawn by `llmsched plot`, beside its timeseries.csv)
RUN_MARKERS = (
    ("network", "calls.csv"),
    ("serverless", "instances.csv"),
    ("single-server", "timeseries.csv"),
    ("sweep", "results.csv"),
    ("sweep", "points"),
    ("reproduce twp", "table3.csv"),
    ("reproduce clusters", "clusters_p99.png"),
    ("reproduce agents", "agents_backlog.csv"),
    ("reproduce rybko-stolyar", "rybko_stolyar_backlog.csv"),
    ("reproduce prefix-caching", "result.json"),
    ("reproduce stability", "queue.png"),
    ("reproduce stability", "search"),
)


def _held(folder) -> tuple[str, str] | None:
    """(the kind of run whose outputs `folder` holds, the marker that says so), or None."""
    for kind, marker in RUN_MARKERS:
        if (Path(folder) / marker).exists():
            return kind, marker
    return None


def run_kind(folder) -> str | None:
    """The kind of run whose outputs `folder` holds (network, serverless, single-server,
    sweep, reproduce EXPERIMENT), or None."""
    held = _held(folder)
    return None if held is None else held[0]


def _named(kind: str) -> str:
    if kind in SIMULATE_KINDS:
        return f"a {kind} simulation"
    return "a sweep" if kind == "sweep" else f"`{kind}`"


def check_run_dir(path, kind: str, what: str = "output folder") -> None:
    """Raise ConfigError unless a `kind` run may write into `path`: a folder that does not
    exist, is empty, holds a run of the same kind (which the new run replaces; the kinds
    of simulate run replace one another) with its proof (a simulate run's summary.json, a
    sweep's points/, an experiment's table.json or result.json, each holding what the run
    writes: file names a run writes are no proof alone, and without the proof a folder
    holding any of them is refused, a run that stopped before its last file included, but
    for a stability run's search/points/ of its probes' records, `RESUME_PROOFS`, which
    lets an interrupted run resume, and a simulate run's, an experiment's or a sweep's folder
    that it marked while writing, `INCOMPLETE_MARK`, which a rerun replaces; a folder marked by
    another kind of run is refused), or other files none of which it would replace (hidden
    files are not counted). Never over another tool's files (a model folder's config.json)
    nor over another kind of run's outputs (they would mix); an experiment's folder of an earlier run (a stability run's
    search/), which the run replaces or clears away, must hold only what a run writes
    there."""
    _check_named_folder(path, what)
    folder = Path(path)
    if kind == "sweep" and _STABILITY_SEARCH.get() != os.path.realpath(folder):
        # (its table.json reads the search, and its rerun resumes from the search's records)
        owner = stability_run_of_search(folder)
        if owner is not None:
            raise ConfigError(
                f"{what} {str(path)!r} is the rate search of the `llmsched reproduce stability` run in "
                f"{str(owner)!r}, which a sweep would overwrite: rerun that experiment there, or choose another folder"
            )
    if not folder.is_dir():
        return
    proof, written_first = RUN_PROOFS.get(kind, (None, False))
    stopped = interrupted_kind(folder)
    if stopped is not None and stopped != kind and not (stopped in SIMULATE_KINDS and kind in SIMULATE_KINDS):
        # (its files so far are no proof of its kind: `_held` may find none of them)
        raise ConfigError(
            f"{what} {str(path)!r} holds {_named(stopped)} that stopped while writing its files "
            f"({INCOMPLETE_MARK}), not {_named(kind)}: rerun it there, or choose another folder"
        )
    found = _held(folder)
    if found is not None:
        held, marker = found
        if held != kind and not (held in SIMULATE_KINDS and kind in SIMULATE_KINDS):
            raise ConfigError(
                f"{what} {str(path)!r} holds the outputs of {_named(held)} ({marker}), "
                f"not of {_named(kind)}: choose another folder or remove it"
            )
    has_proof = proof is not None and ((folder / proof).exists() or (folder / proof).is_symlink())
    if has_proof:
        flaw = _proof_flaw(folder / proof)
        if flaw is not None:
            owner = "an llmsched run" if kind in SIMULATE_KINDS else _named(kind)
            raise ConfigError(
                f"{what} {str(path)!r} holds a {proof!r} that is not {owner}'s ({flaw}), which the run "
                "would replace: choose another folder or empty it"
            )
    resume = RESUME_PROOFS.get(kind)
    users_sweep = False
    if not has_proof and resume is not None:
        # an interrupted run's records (no link: a folder elsewhere proves nothing here);
        # any other file in search/ is refused below as no run's
        r = folder / resume
        has_proof = all(not q.is_symlink() for q in (r, r.parent)) and r.is_dir() and _proof_flaw(r) is None
        # a finished sweep there, in a folder no stability run marked, is the user's own
        # (`sweep --out X/search`; a stability run marks its folder before its search),
        # whose results.csv and figures the run would replace (refused below, after a stray)
        finished = r.parent / LAST_FILES["sweep"]
        users_sweep = has_proof and stopped is None and finished.exists() and interrupted_kind(r.parent) is None
    # a run that stopped while writing its files (its mark, no summary.json, table.json or
    # result.json yet): a run's folder, which a rerun of its kind replaces (any simulate
    # kind's, a simulation's)
    interrupted = not has_proof and stopped is not None
    has_proof = has_proof or interrupted
    if kind not in SIMULATE_KINDS and kind != "sweep":  # (a sweep's points/: its proof's check)
        for name in RUN_OUTPUTS[kind]:
            sub = folder / name
            if name in RUN_FOLDERS and sub.is_dir() and not sub.is_symlink():
                strays = _strays(sub, name)
                if strays:
                    raise ConfigError(
                        f"{what} {str(path)!r}: {name}/ holds {strays[0]!r}, which no llmsched run writes "
                        f"there, and {_named(kind)} replaces or removes {name}/: move it out, or choose "
                        "another folder"
                    )
    if users_sweep:
        raise ConfigError(
            f"{what} {str(path)!r}: {resume.split('/')[0]}/ holds a finished sweep (its {LAST_FILES['sweep']}), "
            f"not the search of a `llmsched {kind}` run that stopped, which the run would replace: choose "
            "another folder, or move that sweep out"
        )
    servers = folder / "servers"
    if kind in SIMULATE_KINDS and servers.is_dir() and not servers.is_symlink():
        # a network's replica folders, which a network run replaces (a replica of the same
        # name) and any other simulate run clears: only folders a run proves it wrote
        unproven = _unproven_replica(servers)
        if unproven is not None:
            raise ConfigError(
                f"{what} {str(path)!r}: servers/ holds {unproven!r} in a folder that is not a network replica's "
                f"(no {_SIMULATE_PROOF} of an llmsched run in it), which the run could replace or remove: move it "
                "out, or choose another folder"
            )
    # a marker is a file name, not proof (`RUN_PROOFS`): without its proof, the folder's
    # files are checked below as any folder's are
    # (a marked folder: every file of the kind's in it is the interrupted run's, the earlier
    # run's removed before it wrote any, or the earlier run's kept while a stability run
    # searched, `EARLIER_KEPT`; the user's other files stay beside them)
    if has_proof:
        _check_figures_ours(folder, kind, what)
    if (found is not None or interrupted) and has_proof:
        return
    if kind in SIMULATE_KINDS:
        ours = {_SIMULATE_PROOF, "config.json", *(n for k in SIMULATE_KINDS for n in RUN_OUTPUTS[k])}
    else:
        ours = set(RUN_OUTPUTS[kind]) | ({proof} if proof else set())
    names = sorted(e.name for e in os.scandir(folder))
    # a write's temporary file (.NAME.tmp) and the writable-folder probe are ours too
    # (hidden files: a write's .NAME.tmp, the writable-folder probe, a desktop's .DS_Store)
    foreign = [n for n in names if n not in ours and not n.startswith(".")]
    # files of its own beside other files (a shared results/ folder): nothing is replaced;
    # a file the run would write among other files (a model folder's config.json) would be
    collide = [n for n in names if n in ours]
    if collide and foreign:
        raise ConfigError(
            f"{what} {str(path)!r} holds files that are not an llmsched run's ({foreign[0]!r}) beside "
            f"{collide[0]!r}, which the run would replace: choose another folder or empty it"
        )
    if "config.json" in names and _SIMULATE_PROOF not in names and not interrupted:  # (a simulate run's)
        # a simulate run writes a config.json; other runs write none, but not into another
        # tool's folder (a model's): its files and theirs would mix
        if kind in SIMULATE_KINDS:
            why = ", which the run would replace"
        else:
            why = f": another tool's folder (a model's?), which {_named(kind)} does not write into"
        raise ConfigError(
            f"{what} {str(path)!r} holds a config.json that is not an llmsched run's (no {_SIMULATE_PROOF} beside "
            f"it){why}: choose another folder or empty it"
        )
    if collide and not has_proof:
        # the user's own requests.csv, results.csv or table.csv, which the run would replace
        # or clear away as stale (an experiment's proof, written last, is missing too from a
        # run that stopped before it: its files are no run's that can be told from the user's)
        why = "first: not such a run's output" if written_first else "last: not a finished run's output"
        if resume is not None:
            why += f" (nor an interrupted one's: no {resume}/ of its records)"
        elif kind in MARKED_KINDS and not written_first:  # (a marked sweep has its points/)
            why += f" (nor an interrupted one's: no {INCOMPLETE_MARK} beside it)"
        raise ConfigError(
            f"{what} {str(path)!r} holds {collide[0]!r} but no {proof!r}, which {_named(kind)} writes {why}, "
            "and the run would replace it: choose another folder or empty it"
        )


def _check_figures_ours(folder: Path, kind: str, what: str) -> None:
    """In a run's folder, which the run's rerun replaces, a file under a figure's name that
    is no figure is the user's (notes in queue.png were removed, exit 0): refused."""
    kinds = SIMULATE_KINDS if kind in SIMULATE_KINDS else (kind,)
    for name in (n for k in kinds for n in RUN_OUTPUTS[k] if n.endswith(".png")):
        p = folder / name
        if is_someone_elses_file(p):
            raise ConfigError(
                f"{what} {str(folder)!r} holds {name!r}, which is not a figure, and the run would replace or "
                "remove it with the earlier run's files: move it out, or choose another folder"
            )


def prepare_run_dir(path, kind: str) -> Path:
    """The folder a `kind` run writes into, checked (`check_run_dir`: not over another
    run's outputs nor another tool's files) and created (held, `make_run_dir`)."""
    check_out_dir(path)  # (reproduce_twp(out_dir="/dev/null/x") raised NotADirectoryError)
    check_run_dir(path, kind)
    return make_run_dir(path)


def clear_stale(path, kind: str, written) -> None:
    """After a `kind` run wrote `written` into `path`: remove the files of an earlier run
    of that kind which this one did not rewrite (a search of an earlier run, a table or
    figure of other options), so that nothing of it stays beside the new files. Of a
    folder (`RUN_FOLDERS`), only what a run writes in it goes, and the folder when that
    empties it: never a file no run writes there."""
    folder = Path(path)
    kept = {Path(f).name for f in written}
    for name in RUN_OUTPUTS[kind]:
        if name in kept:
            continue
        p = folder / name
        if p.is_dir() and not p.is_symlink():
            if name in RUN_FOLDERS:
                remove_run_folder(p, name)
        elif p.is_file() or p.is_symlink():
            p.unlink(missing_ok=True)


def recorded_path(path: str) -> str:
    """`path` as a run's config.json records it: absolute when it names an existing file
    or folder (a relative path is read from where the command runs, so a rerun from
    another folder would not find it), as given otherwise (a dataset name, which the
    traces folders resolve wherever the run is)."""
    p = os.path.expanduser(path)
    return os.path.abspath(p) if os.path.exists(p) else path


def check_out_dir(path, what: str = "output folder") -> None:
    """Raise ConfigError unless `path` is a folder that can be written, or can be made
    ('' names none: the current folder is written only when named, as '.')."""
    _check_named_folder(path, what)
    _check_folder(path, Path(path), what)


def check_out_file(path, what: str = "output file", *, make_parents: bool = False) -> None:
    """Raise ConfigError unless a file can be written at `path`: not a folder, in a folder
    that exists (or, with `make_parents`, can be made) and can be written."""
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"{what} {str(path)!r} is a folder, not a file")
    if p.exists() and not os.access(p, os.W_OK):
        raise ConfigError(f"{what} {str(path)!r} is not writable")
    parent = p.absolute().parent
    if not make_parents and not parent.exists():
        raise ConfigError(f"{what} {str(path)!r}: folder {str(parent)!r} does not exist")
    _check_folder(path, parent, what)


#: the first bytes of a figure of each format written (matplotlib's SVG starts with its
#: XML declaration)
FIGURE_MAGIC = {".png": (b"\x89PNG\r\n\x1a\n",), ".pdf": (b"%PDF-",), ".svg": (b"<?xml", b"<svg")}


def is_someone_elses_file(path) -> bool:
    """Whether `path` is a non-empty file that is no figure of its format (`is_a_figure`):
    a file of the user's under a figure's name, which redrawing would replace (an empty
    one, `mktemp`'s, has nothing to lose)."""
    p = Path(path)
    return p.is_file() and p.stat().st_size > 0 and not is_a_figure(p)


def is_a_figure(path) -> bool:
    """Whether the file at `path` is a figure of the format its name says (by its first bytes)."""
    magic = FIGURE_MAGIC.get(os.path.splitext(str(path))[1].lower(), ())
    try:
        with open(path, "rb") as f:
            head = f.read(16)
    except OSError:  # (one that cannot be read is not known to be a figure: kept)
        return False
    return any(head.startswith(m) for m in magic)


def check_not_an_input(path, inputs, what: str) -> None:
    """Refuse (ConfigError) an output file `path` that is one of `inputs`, the files the
    run reads (a trace given as `--trace t.png --plot t.png` was drawn over). Compared as
    files (samefile: a link, a hard link, another spelling of the path), not as text."""
    for given in inputs:
        try:
            same = os.path.samefile(path, given)
        except OSError:  # (the output is not there yet: it is no input)
            continue
        if same:
            raise ConfigError(
                f"{what} {str(path)!r} is a file this run reads ({_shown(Path(given).absolute())}): "
                "give another file, it would be replaced"
            )


def atomic_write(path, writer, *, replace_entry: bool = False) -> None:
    """`writer(tmp)` then rename tmp to `path`: the file appears whole or not at all, and
    a write that stops (an error, Ctrl-C) leaves the file that was there as it was (its
    temporary file removed). Written through a symbolic link (the file it names is
    replaced, the link stays a link); a path that is no regular file (a FIFO, a device
    such as /dev/stdout), which no rename may replace, is written straight to (not
    whole-or-nothing: there is no earlier file to keep). The file keeps its permissions; a
    file with other hard links is written in place (a rename would part it from them). The
    temporary file has a short name of its own, so a name at the file system's limit works.
    `replace_entry`: whatever is at `path` itself (a link, a FIFO, a file with other hard
    links) is replaced by the new file, as a rename does, its mode not kept: for a file
    whose name only llmsched gives (a sweep's points/KEY.json), where a link or a hard link
    is no file of the user's to write through but another point's record."""
    st = None
    if not replace_entry:
        try:
            st = os.stat(path)  # (through links)
        except OSError:  # (nothing there yet, or a link to nothing: a new file)
            st = None
    if st is not None and (not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)) or st.st_nlink > 1):
        writer(Path(path))
        return
    real = Path(path) if replace_entry else Path(os.path.realpath(path))
    tmp = real.with_name(f".llmsched-{os.getpid()}-{os.urandom(4).hex()}.tmp")
    try:
        writer(tmp)
        if st is not None:
            os.chmod(tmp, stat.S_IMODE(st.st_mode))
        os.replace(tmp, real)
    except BaseException as e:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:  # (no folder to hold it, `file/x.csv`: nothing was written, and the error is e's)
            pass
        if isinstance(e, OSError) and e.filename is not None and os.fsdecode(e.filename) == str(tmp):
            e.filename = str(path)  # the file the user asked for, not a temporary one now gone
        raise


def save_figure(fig, path: Path) -> str:
    """Lay out and write `fig` as a PNG at `path` (whole or not at all); returns the path."""
    fig.tight_layout()
    # bbox "tight": the saved image grows to hold every title, label and legend (nothing clipped)
    try:
        atomic_write(Path(path), lambda p: fig.savefig(p, format="png", bbox_inches="tight", pad_inches=0.1))
    except OSError as e:  # (a folder or a read-only file in the figure's place)
        raise ConfigError(f"{path} cannot be written: {e.strerror or e}") from None
    return str(path)


__all__ = [
    "save_figure",
    "FIGURE_MAGIC",
    "is_a_figure",
    "is_someone_elses_file",
    "check_not_an_input",
    "atomic_write",
    "begin_reproduce_write",
    "begin_simulate_write",
    "begin_sweep_write",
    "EARLIER_KEPT",
    "mark_reproduce_search",
    "end_reproduce_write",
    "end_simulate_write",
    "end_sweep_write",
    "LAST_FILES",
    "INCOMPLETE_MARK",
    "interrupted_kind",
    "interrupted_message",
    "is_interrupted_run",
    "MARKED_KINDS",
    "REPRODUCE_KINDS",
    "is_replica_folder",
    "RUN_FOLDERS",
    "RUN_MARKERS",
    "RUN_OUTPUTS",
    "RESUME_PROOFS",
    "SIMULATE_KINDS",
    "check_out_dir",
    "check_out_file",
    "check_inputs_kept",
    "check_run_dir",
    "read_point_record",
    "remove_temporary_files",
    "clear_stale",
    "recorded_path",
    "remove_run_folder",
    "run_kind",
]
