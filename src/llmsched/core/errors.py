"""Errors a user can cause: the CLI prints them on one line and exits with code 2."""


class ConfigError(ValueError):
    """Invalid input (an option, a file, a workload) named in one sentence."""


def count_text(n: int) -> str:
    """A whole number for a message: with thousands separators, or in e-notation past 1e15
    (`b_max: 1e300` read as an int would print three hundred digits)."""
    if abs(n) < 10**15:
        return f"{n:,}"
    try:
        return f"{float(n):.3g}"
    except OverflowError:  # past a float's range (and str(n) fails past 4,300 digits): its magnitude
        import math  # noqa: PLC0415 - only on the error path

        return f"about {'-' if n < 0 else ''}1e+{int(math.log10(abs(n)))}"


def closest(name, known, cutoff: float = 0.6) -> str | None:
    """The known name closest to a misspelt `name` (difflib's ratio >= `cutoff`), or None:
    the "did you mean ...?" of every error about an unknown name."""
    import difflib  # noqa: PLC0415 - only on the error path

    close = difflib.get_close_matches(str(name), [str(k) for k in known], n=1, cutoff=cutoff)
    return close[0] if close else None


def unknown_name(what: str, name, known) -> ConfigError:
    """The one-line error for a name that is not among `known`, with a suggestion when one
    is close ("did you mean ...?") and the known names otherwise."""
    known = sorted(known)
    close = closest(name, known)
    hint = f"; did you mean {close!r}?" if close else f" (known: {', '.join(known)})"
    return ConfigError(f"unknown {what} {name!r}{hint}")


def check_known(what: str, names, known) -> None:
    """`unknown_name`'s error for the first of `names`, in sorted order, not among `known`."""
    unknown = set(names) - set(known)
    if unknown:
        raise unknown_name(what, min(unknown), known)


def unknown_option(what: str, name, options, known) -> ConfigError:
    """The one-line error for options a policy does not take, one form for every policy:
    `admission policy 'twp': unknown option 'foo' (known: eps, ...)`, naming the first
    unknown option in sorted order, and `(fcfs takes no options)` when `known` is empty."""
    takes = f"known: {', '.join(known)}" if known else f"{name} takes no options"
    return ConfigError(f"{what} {name!r}: unknown option {min(options)!r} ({takes})")


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived while work that holds other processes ran (a sweep's pool): raised
    like Ctrl-C's KeyboardInterrupt so that the work stops them on its way out; the CLI
    exits with 143 (128 + SIGTERM)."""


class InputWarning(UserWarning):
    """An input that is valid but probably not what the user meant (units off by 1000, a
    profile far outside its measurements, an option that has no effect). The command line
    prints it as one line on stderr and the run continues."""


BLOCK_SIZE_UNUSED = "has no effect without prefix caching"


class BlockSizeUnusedWarning(InputWarning):
    """A block size given where no run has a prefix cache. A sweep judges it once for all
    its points (`analysis.sweep.run_sweep`: where one point caches, the block size has its
    effect there) and ignores its points' own by this category, not by their text."""


def warn_block_size_unused(sizes: list[int], where: str = "", switch: str = "--prefix-caching") -> None:
    """Warn (`BlockSizeUnusedWarning`) that the block sizes `sizes` do nothing (at `where`,
    such as a network's server, turned on by `switch`); the warning names the first line
    outside llmsched (the user's call), however deep in llmsched it is decided."""
    import warnings  # noqa: PLC0415

    text = f"{where}block_size={', '.join(str(b) for b in sizes)} {BLOCK_SIZE_UNUSED} ({switch})"
    warnings.warn(text, BlockSizeUnusedWarning, stacklevel=outside_llmsched())


def outside_llmsched() -> int:
    """The `stacklevel` for a `warnings.warn` in the function that calls this one that
    names the first line outside llmsched's modules."""
    import sys  # noqa: PLC0415

    frame, level = sys._getframe(1), 1  # (stacklevel 1: the function calling warnings.warn)
    while frame is not None and frame.f_globals.get("__name__", "").partition(".")[0] == "llmsched":
        frame, level = frame.f_back, level + 1
    return level


def warn(message: str, stacklevel: int = 3) -> None:
    """Warn about an implausible input (`InputWarning`, one sentence); the run goes on.
    The warning names the line that called the caller of `warn` (one more level for each
    helper in between)."""
    import warnings  # noqa: PLC0415

    warnings.warn(message, InputWarning, stacklevel=stacklevel)
