"""Names shared by layers that cannot import one another: the admission policies' names
and their aliases (the policy registry builds them; a serverless file keys options by them)."""

#: admission policies by their canonical names (`policies.ADMISSION_POLICIES` keys)
ADMISSION_NAMES = ("fcfs", "spf", "twp", "dynamicbatch")
#: other spellings of those names
ADMISSION_ALIASES = {
    "shortest-prompt-first": "spf",
    "priority": "spf",
    "token-window-pacing": "twp",
    "dynamic-batch": "dynamicbatch",
}

#: other spellings of the run options' keys (simulate()'s, a sweep grid's), vLLM's flag
#: names among them: the command line's flags take them as aliases (`--max-num-batched-tokens`
#: for `--b-max`) and a sweep's `--grid` reads them as the key they spell
OPTION_ALIASES = {
    "scheduler": "policy",
    "max_num_batched_tokens": "b_max",
    "max_num_seqs": "max_running",
    "enable_prefix_caching": "prefix_caching",
    "admission_option": "admission_options",
    "admission_opt": "admission_options",
}


def option_flags(key: str, flag: str) -> list[str]:
    """`flag`, the command-line flag of the option `key`, and its aliases (OPTION_ALIASES)."""
    others = ["--" + a.replace("_", "-") for a, k in OPTION_ALIASES.items() if k == key]
    return [flag, *[f for f in others if f != flag]]
