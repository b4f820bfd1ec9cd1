"""A model's chat template, rendered as Hugging Face transformers' `apply_chat_template`
(and so vLLM) renders it: Jinja2 in an immutable sandbox (`trim_blocks`, `lstrip_blocks`,
the `loopcontrols` extension, `{% generation %}` blocks), with transformers' `tojson`
filter (no HTML escaping), `raise_exception(msg)`, `strftime_now(fmt)`, `dict` and a
`namespace` that refuses underscore names. The template sees `messages` (each a dict:
`role`, `content` and the request's `name`, `tool_calls`, `tool_call_id`), `tools` (the
request's, else `chat_template_kwargs`' or None), `documents` (`chat_template_kwargs`' or
None), `add_generation_prompt`, the tokenizer's named special tokens (`bos_token`,
`eos_token`, `unk_token`, `sep_token`, `pad_token`, `cls_token`, `mask_token`, those it
has) and the request's `chat_template_kwargs`.

Where the templates come from (`resolve_template`, each file read once): the folder's
`chat_template.jinja` (named `default`) and `additional_chat_templates/NAME.jinja`, else
`tokenizer_config.json`'s `chat_template` (a string, or a list of named templates). Of
named templates, `tool_use` renders requests that give tools and `default` the others,
as transformers picks them. `--chat-template` (`load_template_arg`) overrides them all: a
file, or the template itself (a string holding `{`, `}` or a newline; `\\n` escapes are
decoded), as vLLM's option takes it.

A message's `content` reaches the template as vLLM's `--chat-template-content-format auto`
gives it: as a list of `{"type": "text", "text": ...}` parts (a string is one part, a null
content none) when the template loops over a message's content (`{% for part in
message['content'] %}`, the message a loop variable over `messages` or over a name set from
it, or a loop over a name `content`), else as one string (parts joined by newlines).

The rendered text carries the template's special tokens (BOS): it is tokenized without
adding them again, as `apply_chat_template(tokenize=True)` does. No torch here.
"""

from __future__ import annotations

import codecs
import json
from datetime import datetime
from pathlib import Path

from ..core.errors import ConfigError

SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
TEMPLATE_FILE = "chat_template.jinja"
TEMPLATE_DIR = "additional_chat_templates"  # NAME.jinja: the named templates besides the default
# what continue_final_message appends to the last message, to find where it ends once rendered
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "
MAX_ERROR_CHARS = 500


class TemplateRaised(Exception):
    """`raise_exception(msg)` called by a template."""


def _clip(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def _environment():
    try:
        import jinja2  # noqa: PLC0415 - the server extra
        import jinja2.ext  # noqa: PLC0415
        from jinja2 import nodes  # noqa: PLC0415
        from jinja2.sandbox import ImmutableSandboxedEnvironment  # noqa: PLC0415
    except ImportError:
        raise ConfigError("applying the model's chat template needs jinja2 (pip install 'jinja2>=3.1.6')") from None

    class GenerationBlocks(jinja2.ext.Extension):
        """`{% generation %}...{% endgeneration %}` (transformers' assistant-mask marker):
        renders its body."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    def raise_exception(message):
        raise TemplateRaised(str(message))

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    class TemplateDict:
        def __call__(self, *args, **kwargs):
            return dict(*args, **kwargs)

        def fromkeys(self, *args, **kwargs):
            return dict.fromkeys(*args, **kwargs)

    class TemplateNamespace(jinja2.utils.Namespace):
        def __init__(*args, **kwargs):  # noqa: N805 - Jinja's own signature trick
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check_name(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(f"a template namespace cannot hold the name {name!r}")

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationBlocks, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["dict"] = TemplateDict()
    env.globals["namespace"] = TemplateNamespace
    return env


def content_text(content) -> str:
    """A message's content (a string, or text parts) as one string: the parts joined by newlines."""
    return content if isinstance(content, str) else "\n".join(part["text"] for part in content)


def content_parts(content) -> list[dict]:
    """A message's content (a string, or text parts) as new text parts."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [{"type": "text", "text": part["text"]} for part in content]


def loops_over_contents(tree) -> bool:
    """Whether a parsed template (a `jinja2.nodes.Template`) loops over a message's content,
    as vLLM's content-format detection finds it (see the module docstring)."""
    from jinja2 import nodes  # noqa: PLC0415 - the caller has jinja2

    def under(node):  # the expression below filters, tests and slices
        while True:
            if isinstance(node, (nodes.Filter, nodes.Test)) and node.node is not None:
                node = node.node
            elif isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Slice):
                node = node.node
            else:
                return node

    def is_name(node, names) -> bool:
        node = under(node)
        return isinstance(node, nodes.Name) and node.name in names

    def is_content_of(node, names) -> bool:
        node = under(node)
        if isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Const):
            field = node.arg.value
        elif isinstance(node, nodes.Getattr):
            field = node.attr
        else:
            return False
        return field == "content" and is_name(node.node, names)

    lists = {"messages"}  # and the names set from it: {% set loop_messages = messages[1:] %}
    while True:
        more = {
            a.target.name
            for a in tree.find_all(nodes.Assign)
            if isinstance(a.target, nodes.Name) and a.target.name not in lists and is_name(a.node, lists)
        }
        if not more:
            break
        lists |= more
    loops = list(tree.find_all(nodes.For))
    items = {f.target.name for f in loops if isinstance(f.target, nodes.Name) and is_name(f.iter, lists)}
    return any(is_content_of(f.iter, items) or is_name(f.iter, {"content"}) for f in loops)


def _token_text(v) -> str | None:
    """A special token as tokenizer_config.json gives it: a string, or {"content": ...}."""
    if isinstance(v, dict):
        v = v.get("content")
    return v if isinstance(v, str) else None


def special_tokens(config: dict, folder: Path) -> dict[str, str]:
    """The named special tokens of a tokenizer folder whose tokenizer_config.json is
    `config`, then of its special_tokens_map.json for those the config lacks, as strings."""
    out = {key: t for key in SPECIAL_TOKENS if (t := _token_text(config.get(key))) is not None}
    if len(out) < len(SPECIAL_TOKENS):
        token_map = _read_json(folder / "special_tokens_map.json")
        for key in SPECIAL_TOKENS:
            t = _token_text(token_map.get(key))
            if t is not None:
                out.setdefault(key, t)
    return out


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


class ChatTemplate:
    """A compiled chat template and the special tokens it is rendered with. `source`
    names where it came from (error messages)."""

    def __init__(self, text: str, source: str, tokens: dict[str, str] | None = None):
        env = _environment()
        import jinja2  # noqa: PLC0415 - _environment() found it

        self.text = text
        self.source = source
        self.tokens = dict(tokens or {})
        try:
            self._template = env.from_string(text)
            self.content_as_parts = loops_over_contents(env.parse(text))
        except jinja2.TemplateSyntaxError as e:
            raise ConfigError(
                f"{source} is not a valid Jinja chat template: {_clip(str(e.message or e), 200)} (line {e.lineno})"
            ) from None
        except ConfigError:
            raise
        except Exception as e:  # noqa: BLE001 - anything else the compiler refuses
            raise ConfigError(f"{source} is not a valid Jinja chat template: {_clip(str(e), 200)}") from None

    def render(
        self,
        messages: list[dict],
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        template_kwargs: dict | None = None,
        tools: list | None = None,
    ) -> str:
        """The conversation's text; ConfigError (with the template's message) if the template
        raises or cannot render it. `tools` (the request's) wins over `template_kwargs`'."""
        if continue_final_message and add_generation_prompt:
            raise ConfigError("continue_final_message and add_generation_prompt cannot both be true")
        shape = content_parts if self.content_as_parts else content_text
        chat = [{**m, "content": shape(m["content"])} if "content" in m else dict(m) for m in messages]
        final = None
        if continue_final_message:
            if not chat:
                raise ConfigError("continue_final_message needs a final message to continue")
            # the text to continue: the content, or its last part (as transformers picks it)
            holder, key = chat[-1], "content"
            if isinstance(holder.get(key), list):
                holder, key = (holder[key][-1] if holder[key] else {}), "text"
            final = holder.get(key)
            if not isinstance(final, str):
                raise ConfigError("continue_final_message needs a final message with text content")
            if "content" not in self.text:
                raise ConfigError("continue_final_message: this chat template does not render message contents")
            holder[key] = final + _CONTINUE_TAG
        kwargs = template_kwargs or {}
        # as transformers: the special tokens, then the kwargs (which may replace them)
        variables = {**self.tokens, **kwargs}
        variables.update(
            messages=chat,
            tools=tools if tools is not None else kwargs.get("tools"),
            documents=kwargs.get("documents"),
            add_generation_prompt=add_generation_prompt,
        )
        try:
            text = self._template.render(**variables)
        except TemplateRaised as e:
            raise ConfigError(f"the chat template refused the messages: {_clip(str(e))}") from None
        except RecursionError:
            raise ConfigError("the chat template failed: it recursed too deeply") from None
        except Exception as e:  # noqa: BLE001 - the template's own error: the request's 400
            raise ConfigError(f"the chat template failed: {type(e).__name__}: {_clip(str(e))}") from None
        if final is not None:
            tag = _CONTINUE_TAG.strip()
            if final.strip() not in text or tag not in text:
                raise ConfigError(
                    "continue_final_message: the final message does not appear in the rendered chat "
                    "(the chat template changes or drops it)"
                )
            at = text.rindex(tag)
            # a template that keeps the spacing: cut at the tag; one that trimmed it: cut and strip
            text = text[:at] if text[at : at + len(_CONTINUE_TAG)] == _CONTINUE_TAG else text[:at].rstrip()
        return text


def _read_template(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read the chat template {path}: {e}") from None


def named_templates(folder: Path, config: dict) -> dict[str, tuple[str, str]]:
    """{name: (template text, where it came from)} of a tokenizer folder whose
    tokenizer_config.json is `config`, as transformers reads them: the template files
    (`chat_template.jinja` is `default`) if there are any, else the config's
    `chat_template` (a string is `default`; a list holds {"name", "template"} entries).
    An empty template is no template."""
    found: dict[str, tuple[str, str]] = {}
    f = folder / TEMPLATE_FILE
    if f.is_file():
        found["default"] = (_read_template(f), str(f))
    extra = folder / TEMPLATE_DIR
    if extra.is_dir():
        for g in sorted(extra.glob("*.jinja")):
            if g.is_file():
                found[g.name.removesuffix(".jinja")] = (_read_template(g), str(g))
    if not found:
        cfg = folder / "tokenizer_config.json"
        value = config.get("chat_template")
        if isinstance(value, str):
            found["default"] = (value, f"{cfg} (chat_template)")
        elif isinstance(value, list):
            for t in value:
                if isinstance(t, dict) and isinstance(t.get("name"), str) and isinstance(t.get("template"), str):
                    found[t["name"]] = (t["template"], f"{cfg} (chat_template {t['name']!r})")
    return {name: found[name] for name in found if found[name][0]}


class ChatTemplates:
    """The chat templates a tokenizer renders requests with: `default`, and `tool_use` for
    requests that give tools (transformers' choice among named templates). Either may be
    None (a request it would render gets `role: content` lines)."""

    def __init__(self, default: ChatTemplate | None, tool_use: ChatTemplate | None = None):
        self.default = default
        self.tool_use = tool_use

    def pick(self, tools) -> ChatTemplate | None:
        if tools is not None and self.tool_use is not None:
            return self.tool_use
        return self.default

    @property
    def source(self) -> str | None:
        """Where the default template came from (None: there is none)."""
        return self.default.source if self.default is not None else None


def load_template_arg(arg: str) -> tuple[str, str]:
    """(template text, where it came from) of `--chat-template FILE_OR_STRING`, as vLLM reads
    it: a file if one is there, else the template itself if it holds `{`, `}` or a newline
    (its escapes such as `\\n` decoded), else a ConfigError (a file that is not there)."""
    if not isinstance(arg, str) or not arg.strip():
        raise ConfigError("--chat-template needs a file or a template, got ''")
    p = Path(arg)
    try:
        is_dir, is_file = p.is_dir(), p.is_file()
    except (OSError, ValueError):  # a template string too long (or too odd) to be a path
        is_dir = is_file = False
    if is_dir:
        raise ConfigError(f"--chat-template {arg} is a folder; give the template file (or the template)")
    if is_file:
        try:
            return p.read_text(encoding="utf-8"), f"--chat-template {arg}"
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"--chat-template {arg}: cannot read it: {e}") from None
    if not any(c in arg for c in "{}\n"):
        raise ConfigError(
            f"--chat-template {_clip(arg, 200)}: no such file (nor a template: it has no '{{', '}}' or newline)"
        )
    try:
        text = codecs.decode(arg.encode("latin-1", "backslashreplace"), "unicode_escape")
    except UnicodeDecodeError:
        text = arg
    return text, "--chat-template (the given string)"


def resolve_template(folder, override: str | None = None) -> tuple[ChatTemplates | None, str | None]:
    """(the chat templates to apply or None, a warning to give or None) for a tokenizer
    `folder` (or a tokenizer file in it), with `--chat-template` `override` (which replaces
    them all). Each file of the folder is read once."""
    p = Path(folder)
    p = p if p.is_dir() else p.parent
    config = _read_json(p / "tokenizer_config.json")
    tokens = special_tokens(config, p)
    if override is not None:
        text, source = load_template_arg(override)
        return ChatTemplates(ChatTemplate(text, source, tokens)), None
    named = named_templates(p, config)
    if not named:
        return None, None
    default, tool_use = (
        ChatTemplate(*named[name], tokens) if name in named else None for name in ("default", "tool_use")
    )
    note = None
    if default is None:
        without = "without tools " if tool_use is not None else ""
        note = (
            f"{p} has named chat templates ({', '.join(sorted(named))}) but none named 'default': chat "
            f"requests {without}are rendered as 'role: content' lines (give --chat-template)"
        )
    if default is None and tool_use is None:
        return None, note
    return ChatTemplates(default, tool_use), note
