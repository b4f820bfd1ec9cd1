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
