"""Named real-workload files (kept outside the project, in a shared `traces` folder).

The traces folder: `$LLMSCHED_TRACES` when it is set (only there: a wrong folder is an
error, not a silent fallback; the empty string counts as unset); otherwise `../shared/traces` relative to the current
directory, then relative to the repository root (the folder above `src/`). The data
files are never copied into the project.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..core.errors import ConfigError
from ..core.paths import recorded_path

__all__ = [
    "DATASETS",
    "traces_dirs",
    "resolve_dataset",
    "resolve_path",
    "is_dataset",
    "file_stamps",
    "recorded_file",
]

# name -> (path relative to the traces folder, prompt column, output column)
DATASETS: dict[str, tuple[str, str, str]] = {
    "sharegpt": (
        "sharegpt_lengths/sharegpt_8k_filtered_stats_llama2_tokenizer.csv",
        "num_prefill_tokens",
        "num_decode_tokens",
    ),
    "arxiv": (
        "arxiv_lengths/arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv",
        "num_prefill_tokens",
        "num_decode_tokens",
    ),
    "azure-conv": ("azure_conv_2023/AzureLLMInferenceTrace_conv.csv", "ContextTokens", "GeneratedTokens"),
}

ENV_VAR = "LLMSCHED_TRACES"


def _repo_root() -> Path:
    # .../src/llmsched/workload/datasets.py -> repository root is the folder above src/
    return Path(__file__).resolve().parents[3]


def traces_dirs() -> list[Path]:
    """Candidate traces folders, in search order, each once: `$LLMSCHED_TRACES` alone when
    set (and not empty), else `../shared/traces` from the current directory and from the repository root
    (one folder when run from the root)."""
    env = os.environ.get(ENV_VAR)
    if env:
        return [Path(env).expanduser()]
    dirs = [Path.cwd() / ".." / "shared" / "traces"]
    dirs.append(_repo_root() / ".." / "shared" / "traces")
    out, seen = [], set()
    for d in dirs:
        key = os.path.normpath(os.path.abspath(d))
        if key not in seen:
            seen.add(key)
            out.append(d)
    return out


def is_dataset(name: str) -> bool:
    return str(name).strip().lower() in DATASETS


def resolve_dataset(name: str) -> Path:
    """Path of a named dataset's file; ConfigError naming every place looked in."""
    key = str(name).strip().lower()
    if key not in DATASETS:
        raise ConfigError(f"unknown dataset '{name}' (known: {', '.join(DATASETS)})")
    rel = DATASETS[key][0]
    hint = f"set {ENV_VAR}=DIR to the folder that holds {rel.split('/', 1)[0]}/"
    tried = []
    for d in traces_dirs():
        p = d / rel
        if p.is_file():
            return p.resolve()
        tried.append(os.path.normpath(os.path.abspath(d)))
    if os.environ.get(ENV_VAR):
        folder = tried[0]
        if not os.path.isdir(folder):
            flaw = "does not exist" if not os.path.exists(folder) else "is not a folder"
            raise ConfigError(f"dataset '{name}' not found: ${ENV_VAR} names {folder}, which {flaw}; {hint}")
        raise ConfigError(f"dataset '{name}' not found: no {rel} under {folder} (${ENV_VAR}); {hint}")
    places = tried[0] if len(tried) == 1 else f"{', '.join(tried[:-1])} or {tried[-1]}"
    raise ConfigError(f"dataset '{name}' not found: no {rel} under {places}; {hint}")


def resolve_path(path: str | os.PathLike) -> Path:
    """A file path, or a dataset name when no file of that name exists."""
    p = Path(os.path.expanduser(str(path)))
    if p.is_file():
        return p
    if is_dataset(str(path)):
        return resolve_dataset(str(path))
    raise not_a_file(p)


def recorded_file(path: str) -> str:
    """A file a configuration names (a trace) as a run's config.json records it: absolute
    (`core.paths.recorded_path`), and a named dataset (`azure-conv`) as the file it
    resolves to now, so that a rerun of the config.json reads that file from any folder,
    whatever $LLMSCHED_TRACES then names (the name as given when it resolves to none)."""
    if not os.path.exists(os.path.expanduser(path)) and is_dataset(path):
        try:
            return str(resolve_dataset(path))
        except ConfigError:
            return path
    return recorded_path(path)


def not_a_file(p: Path) -> ConfigError:
    """The error for a path that is no regular file: missing, or something else."""
    if not p.exists():
        return ConfigError(f"file {p} does not exist")
    # (a pipe, `--trace <(...)` in a shell, cannot be read as often as a trace is)
    return ConfigError(f"{p} is not a file" + (" (a pipe: write it to a file first)" if p.is_fifo() else ""))


def _strings(obj):
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _strings(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _strings(v)


def _profile_files(s: str) -> list[str]:
    """The files a `profile:PATH[#MODEL][,...]` cost model reads: PATH (or PATH less a
    `#MODEL` suffix) when a file, each file in it when a folder; [] for other strings."""
    s = s.strip()
    if not s.lower().startswith("profile:"):
        return []
    from ..core.profile import source_path  # noqa: PLC0415 - start-up: only profile specs need it

    source = source_path(s[len("profile:") :])
    if os.path.isfile(source):
        return [source]
    if os.path.isdir(source):
        return [e.path for e in os.scandir(source) if e.is_file()]
    return []


def file_stamps(d: dict) -> list:
    """(path, size, modification time) of every file a configuration names (a trace,
    `empirical:PATH[:COL]`, `profile:PATH[#MODEL][,...]` with PATH a file or a folder of
    tables (each file in it), and a named dataset of its workload, such as `sharegpt`,
    at the file it resolves to under $LLMSCHED_TRACES now): a point's result depends on
    their contents."""
    stamps = set()
    workload = d.get("workload") if isinstance(d, dict) else None
    named = set(_strings(workload)) if isinstance(workload, dict) else set()
    for s in _strings(d):
        rest = s.split(":", 1)[1] if ":" in s else s
        for f in _profile_files(s):
            st = os.stat(f)
            stamps.add((os.path.abspath(f), st.st_size, st.st_mtime_ns))
        for cand in {s, rest, rest.rsplit(":", 1)[0]}:
            path = cand if cand and os.path.isfile(cand) else None
            if path is None and s in named and cand and is_dataset(cand):
                try:
                    path = str(resolve_dataset(cand))
                except ConfigError:  # not found: the run says so
                    continue
            if path is not None:
                st = os.stat(path)
                stamps.add((os.path.abspath(path), st.st_size, st.st_mtime_ns))
    return sorted(stamps)
