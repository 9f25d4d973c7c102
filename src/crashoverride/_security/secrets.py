"""Secrets recognised by their value, wherever they appear in text.

Names alone miss ``cfg = "token=ghp_..."``, a password inside ``DATABASE_URL`` or a JWT in an
exception message. This module finds such values: provider key formats, JWTs, PEM private keys,
bearer/basic credentials, passwords in URLs and credential-looking values written after a
secret-looking name (``api_key=...``, ``"password": "..."``) in whatever syntax carries them
(the class detect-secrets' keyword detector covers): ``name=value``, ``name: value``, JSON and
JSON inside JSON, YAML, ``.env`` and shell lines, headers and header tuples, query strings,
command-line flags, subscripts, comparisons, byte reprs, XML elements. Code that only names a
secret (``password=self.password``) and templates (``${DB_PASSWORD}``) stay.

A hand-written set rather than detect-secrets: measured here, detect-secrets 1.5 costs ~90 ms to
import (plus requests and PyYAML) and ~0.4 ms per line scanned (a 20 KB prompt: ~150 ms, paid
for every tool result), and its line scanner flags most lines of ordinary source as high-entropy
strings. The formats that matter are few and stable; each is anchored on a literal prefix, so
one compiled pattern scans a 10 KB prompt in about 2 ms (``benchmarks/bench_secrets.py``).

UUIDs, git SHAs and other hex digests are deliberately not secrets: the agent needs them, and
they carry no prefix or secret-looking name to tell a credential from an identifier.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterator

_SECRET_WORDS = (
    r"(passw(or)?d|passphrase|(^|[_-])pass$|[_-]pwd$|secret|token|api[_-]?key|(^|[_-])key$|"
    r"(?-i:[a-z0-9]Key$)|priv(ate)?[_-]?key|access[_-]?key|(^|[_-])pat$|(^|[_-])auth$|"
    r"authori[sz]ation|cookie|credential|session[_-]?id|signature|dsn)"
)
# Names that contain a secret word but name a count, a kind, a place or a lookup key:
# ``max_tokens``, ``token_type``, ``api_key_path``, ``idempotency_key``. Their values are what
# the agent needs to see (an idempotency key tells whether a write already happened).
_ORDINARY_WORDS = (
    r"(tokens|tokeni[sz]\w*|[_-](type|count|limit|len|length|size|name|path|file|ttl|expiry|"
    r"expires([_-]in|[_-]at)?|header|env|var)|(?-i:(Type|Count|Limit|Len|Length|Size|Name|"
    r"Path|File|Ttl|Expiry|ExpiresIn|ExpiresAt|Header|Env|Var))|(^|[_-]|(?<=[a-z]))(sort|"
    r"cache|primary|partition|idempotency|foreign|lookup|group|row|dedup|routing|shard|dict|"
    r"object|hash|range)[_-]?key)$"
)
# Names whose values are secret even when they look ordinary (``password=hunter``).
_ALWAYS_WORDS = r"passw(or)?d|passphrase|(^|[_-])pass$|[_-]pwd$|secret"


@functools.cache
def _names() -> tuple[re.Pattern[str], re.Pattern[str], re.Pattern[str]]:
    # Compiled on first use: ``import crashoverride`` must stay light.
    return (
        re.compile(_SECRET_WORDS, re.IGNORECASE),
        re.compile(_ORDINARY_WORDS, re.IGNORECASE),
        re.compile(_ALWAYS_WORDS, re.IGNORECASE),
    )


def is_secret_name(name: str) -> bool:
    """Whether ``name`` (a variable, key, attribute, header or environment variable) is secret."""
    secret, ordinary, _ = _names()
    return bool(secret.search(name)) and not ordinary.search(name)


# Possessive: a shorter name is always followed by a name character, never a separator.
_KEY_NAME = r"[A-Za-z_][A-Za-z0-9_.-]{0,60}+"


# The alternatives of the one pattern, in priority order, each with what a text must contain
# for it to match there at all. Scanning with every alternative costs ~200 ns a character
# (most positions start an identifier the assignment branch must try); a text lacking an
# alternative's guard is scanned without it, which finds exactly the same secrets.
def _alternatives() -> list[tuple[str, Callable[[str], bool]]]:
    parts = [
        # PEM private keys: a whole block, or what a clipped repr left of one.
        r"(?P<pem>-----BEGIN[A-Z0-9 ]{0,30} PRIVATE KEY( BLOCK)?-----"
        r"(?:[\s\S]{0,20000}?-----END[A-Z0-9 ]{0,30} PRIVATE KEY( BLOCK)?-----"
        r"|(?:[A-Za-z0-9+/=\s:,-]|\\[nr])*+))",
        r"(?P<pemtail>(?<![A-Za-z0-9+/=])(?:[A-Za-z0-9+/=]|\\[nr]|\n){16,}+"
        r"-----END[A-Z0-9 ]{0,30} PRIVATE KEY( BLOCK)?-----)",
        # Provider key formats, each behind its literal prefix.
        r"(?P<token>(?<![A-Za-z0-9])(?:"
        r"sk-(?:proj|ant|svcacct|admin)-[A-Za-z0-9_-]{16,}"
        r"|sk-(?=[A-Za-z0-9]*[0-9])(?=[A-Za-z0-9]*[A-Za-z])[A-Za-z0-9]{20,}"
        r"|(?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}"
        r"|glpat-[A-Za-z0-9_-]{20,}"
        r"|xox[abposre]-[A-Za-z0-9-]{10,}"
        r"|(?:sk|rk|pk)_(?:live|test)_[A-Za-z0-9]{10,}|whsec_[A-Za-z0-9+/=]{16,}"
        r"|(?:AKIA|ASIA|ABIA|ACCA)[A-Z0-9]{16}"
        r"|AIza[0-9A-Za-z_-]{30,}"
        r"|eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*"
        r")(?![A-Za-z0-9]))",
        # Webhook URLs are credentials by themselves: keep the host, mask the path.
        r"(?P<hook>https://hooks\.slack\.com/(?:services|workflows|triggers)/)"
        r"(?P<hookpath>[A-Za-z0-9/_-]{8,})",
        # ``scheme://user:password@host``: mask the password only.
        # (up to the last ``@`` before the host, as ``urllib`` reads it: ``p@ss@host``)
        r"(?P<userinfo>\b[A-Za-z][A-Za-z0-9+.-]{1,20}://[^\s:/@'\"<>]{0,80}:)"
        r"(?P<password>[^\s/?#'\"<>]{1,200})(?=@)",
        # ``Authorization: Bearer <token>`` / ``Basic <base64 of user:password>``.
        r"(?P<scheme>\b(?:[Bb]earer|[Tt]oken|[Bb]asic)\s+)(?P<credential>[A-Za-z0-9._~+/-]{8,}=*)",
        # ``Authorization: <scheme> <credential>`` whatever the scheme (``ApiKey``, ``Token``).
        r"(?P<authz>(?<![A-Za-z0-9_.])(?:b?\\{0,3}['\"])?(?i:(?:proxy-)?authori[sz]ation)"
        r"(?:\\{0,3}['\"])?\]?\s{0,3}[:=,]\s{0,3}(?:b?\\{0,3}['\"])?"
        r"(?P<authscheme>[A-Za-z][\w.-]{1,30})[ \t]+)(?P<authcred>[^\s'\",;()<>\[\]{}\\]{4,500})",
        # ``name=value``, ``name: value``, ``"name": "value"`` with a secret-looking name: the
        # name bare or quoted (escaped quotes of JSON inside JSON, a bytes literal's ``b``),
        # maybe closing a subscript; the separator ``=``, ``:``, ``:=``, ``=>`` or a comparison.
        # (A name that follows the ``\n`` escape of a repr begins with that ``n``: see
        # ``_assignment_span``.)
        r"(?P<assign>(?<![A-Za-z0-9_.])(?=[A-Za-z_'\"\\])(?:b(?=['\"]))?(?P<qk>\\{0,3}['\"]|)"
        rf"(?P<key>{_KEY_NAME})(?P=qk)\]?"
        r"\s{0,3}(?P<sep>:=|[=!]==?|=>|[:=])\s{0,3}(?:b(?=['\"]))?)"
        # The value is looked ahead at, not consumed: when the name is ordinary the scan
        # goes on inside the value (``cfg = "token=ghp_..."``) in linear time.
        r"(?=(?P<dq>\\{0,3}\")(?P<dquoted>[^\"\r\n]{1,500})(?P=dq)"
        r"|(?P<sq>\\{0,3}')(?P<squoted>[^'\r\n]{1,500})(?P=sq)"
        # (never ``Bearer``/``Basic`` as a bare value: the credential after it is)
        # (a bare value ends where a repr's ``\n`` escape begins the next line)
        r"|(?!(?:[Bb]earer|[Bb]asic|[Tt]oken)\s)"
        r"(?P<bare>(?:[^\s'\",;&)}\]<>(\[\\]|\\\\|\\(?![nrt]))"
        r"{1,500}+)(?![(\[]))",
        # A ``(name, value)`` pair of strings: ``(b'x-api-key', b'...')`` in a header list.
        r"(?P<pair>(?<=[(\[])b?(?P<pk>['\"])(?P<pkey>[A-Za-z_][A-Za-z0-9_.-]{0,60})(?P=pk),"
        r"\s{0,3}b?(?P<pq>['\"])(?P<pval>[^'\"\s]{1,500})(?P=pq)(?=[)\]]))",
        # ``--password hunter2``: a secret-named command-line flag and the word after it.
        r"(?P<flag>(?<![\w-])--(?P<fkey>[A-Za-z][\w-]{0,60}+)[ \t]+)"
        r"(?=(?P<fval>[^\s'\"<>$-][^\s'\"<>]{0,500}+))",
        # ``<password>value</password>``: a secret-named element of XML (settings files).
        r"(?P<xml><(?P<xkey>[A-Za-z_][\w.-]{0,60}+)(?:\s[^<>]{0,200})?>)"
        r"(?=(?P<xval>[^<>\r\n]{1,500})</(?P=xkey)>)",
    ]
    names = _NAMES
    assert len(parts) == len(names)
    guards: dict[str, Callable[[str], bool]] = {
        "pem": lambda text: "-----BEGIN" in text,
        "pemtail": lambda text: "-----END" in text,
        "token": lambda text: any(prefix in text for prefix in _TOKEN_PREFIXES),
        "hook": lambda text: "hooks.slack.com/" in text,
        "userinfo": lambda text: "://" in text and "@" in text,
        "scheme": lambda text: any(word in text for word in ("earer", "oken", "asic")),
        "authz": lambda text: "uthori" in text.lower(),
        "assign": lambda text: ":" in text or "=" in text,
        "pair": lambda text: "," in text and any(o in text for o in _PAIR_OPENINGS),
        "flag": lambda text: "--" in text,
        "xml": lambda text: "</" in text,
    }
    return [(part, guards[name]) for part, name in zip(parts, names, strict=True)]


# How a ``(name, value)`` pair of strings opens (see the ``pair`` alternative).
_PAIR_OPENINGS = ("('", '("', "(b'", '(b"', "['", '["', "[b'", '[b"')

# Every literal a provider key format begins with (see the ``token`` alternative).
_TOKEN_PREFIXES = (
    "sk-", "ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_", "glpat-", "xox", "_live_",
    "_test_", "whsec_", "AKIA", "ASIA", "ABIA", "ACCA", "AIza", "eyJ",
)  # fmt: skip


@functools.cache
def _compiled(chosen: tuple[int, ...]) -> re.Pattern[str]:
    # Compiled on first use (~3 ms for all of them), never by ``import crashoverride``.
    alternatives = _alternatives()
    return re.compile("|".join(alternatives[i][0] for i in chosen))


def _pattern_for(text: str, default_names: bool) -> re.Pattern[str] | None:
    """The pattern with only the alternatives that can match somewhere in ``text``."""
    chosen = tuple(i for i, (_, guard) in enumerate(_alternatives_cached()) if guard(text))
    # Under the built-in name rule an assignment (or an XML element) is a secret only if its
    # name holds one of the secret words, so a text with none of them needs neither branch.
    if default_names and not _hints().search(text):
        chosen = tuple(i for i in chosen if i not in _NAMED)
    return _compiled(chosen) if chosen else None


_NAMES = (
    "pem", "pemtail", "token", "hook", "userinfo", "scheme", "authz", "assign", "pair", "flag",
    "xml",
)  # fmt: skip
# The alternatives whose match is a secret only under a secret-looking name.
_NAMED = tuple(_NAMES.index(name) for name in ("assign", "pair", "flag", "xml"))


@functools.cache
def _hints() -> re.Pattern[str]:
    # ``_SECRET_WORDS`` without its anchors (they apply to a whole name, not to a text).
    return re.compile(
        r"pass|pwd|secret|token|key|pat|auth|cookie|credential|session|signature|dsn",
        re.IGNORECASE,
    )


@functools.cache
def _alternatives_cached() -> tuple[tuple[str, Callable[[str], bool]], ...]:
    return tuple(_alternatives())


_DOTTED = r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*"
# A value that stands for a secret kept elsewhere: ``${DB_PASSWORD}``, ``$TOKEN``,
# ``{{ vault_password }}``, ``{password}``, ``%s``, ``<your-api-key>``.
_TEMPLATE = r"\$[A-Za-z_{(]|\{\{|\{%|%[sdr(]|#\{|<[^<>]*>$|\{[A-Za-z_][\w.]*\}$|\[[A-Za-z _-]+\]$"
# An environment variable's name (``GITHUB_TOKEN``): ``NAME=value`` with it is a ``.env`` or
# shell line, whose value is data even when it reads like a name.
_ENV_NAME = r"[A-Z][A-Z0-9_]*"


def random_looking(value: str) -> bool:
    """A credential rather than a word: long enough, with digits or mixed case and symbols."""
    if len(value) < 8 or value.startswith("[REDACTED"):
        return False
    classes = sum(
        (
            any(c.islower() for c in value),
            any(c.isupper() for c in value),
            any(c.isdigit() for c in value),
            any(not c.isalnum() for c in value),
        )
    )
    return classes >= 3 or (classes == 2 and any(c.isdigit() for c in value))


def _basic_credentials(value: str) -> bool:
    import base64
    import binascii

    try:
        decoded = base64.b64decode(value + "=" * (-len(value) % 4), validate=True)
    except (binascii.Error, ValueError):
        return False
    return b":" in decoded


def _placeholder(value: str) -> bool:
    """A mask (ours or someone's) or a template, not a secret."""
    return (
        value.startswith("[REDACTED")
        or set(value) <= {"*", "x", "X"}
        or re.match(_TEMPLATE, value) is not None
    )


def _assignment_secret(
    key: str, value: str, literal: bool, data: bool, is_secret: Callable[[str], bool]
) -> bool:
    """Whether ``value``, written after the name ``key``, is a secret.

    ``literal``: a string literal or a query string's value; ``data``: the text around it is
    data, not code (a header, a command-line flag, a ``.env`` line)."""
    if not is_secret(key) or _placeholder(value):
        return False
    # A bare dotted name is code (``password=self.password``, ``token: anyio.Token``).
    code = not literal and re.fullmatch(_DOTTED, value) is not None
    if code and "." not in value and len(value) >= 16 and any(c.isdigit() for c in value):
        # One long identifier with digits in it is no variable a person named: a token pasted
        # in a config line or a ``.env`` file (``token=ghp_...``, ``GITHUB_TOKEN=fa3b9c...``).
        code = False
    if _names()[2].search(key):
        # ``password=password`` passes a variable on; anything else is the password (a pass
        # phrase too: ``"password": "correct horse battery staple"``).
        if literal:
            return len(value) >= 3
        digits = any(c.isdigit() for c in value)
        return (digits or not code) and value.lower() != key.lower() and _wordlike(value)
    # Tokens and keys hold no spaces: a sentence under such a name is prose.
    if any(c.isspace() for c in value):
        return False
    return not (code and not data) and random_looking(value)


def _wordlike(value: str) -> bool:
    return len(value) >= 3 and any(c.isalnum() for c in value)


def spans(
    text: str, is_secret: Callable[[str], bool] = is_secret_name
) -> Iterator[tuple[int, int]]:
    """The (start, end) of every secret value in ``text``, in order, never overlapping."""
    last = 0
    pattern = _pattern_for(text, is_secret is is_secret_name)
    if pattern is None:
        return
    for match in pattern.finditer(text):
        found = _span(match, text, is_secret)
        if found is not None and found[0] >= last:
            yield found
            last = found[1]


def _span(
    match: re.Match[str], text: str, is_secret: Callable[[str], bool]
) -> tuple[int, int] | None:
    """Where the secret of one match is, if it is one."""
    # A pattern may hold only some alternatives: absent groups read as None.
    group = match.groupdict().get
    if group("pem") is not None or group("pemtail") is not None or group("token") is not None:
        return match.span()
    if group("hookpath") is not None:
        return match.span("hookpath")
    password = group("password")
    if password is not None:
        return None if password.startswith("[REDACTED") else match.span("password")
    credential = group("credential")
    if credential is not None:
        basic = str(group("scheme")).strip().lower() == "basic"
        if random_looking(credential) or (basic and _basic_credentials(credential)):
            return match.span("credential")
        return None
    authcred = group("authcred")
    if authcred is not None:
        # Any scheme's credential, but not a word of prose (``Authorization: missing header``).
        # (``token=`` with nothing after it is a word too)
        word = authcred.rstrip("=")
        plain = word.isalpha() and word.islower()
        return None if plain or _placeholder(authcred) else match.span("authcred")
    pair = group("pval")
    if pair is not None:
        # Data, not code: the value must read as a credential (``("password", "email")`` is a
        # list of field names).
        secret = is_secret(str(group("pkey"))) and not _placeholder(pair)
        return match.span("pval") if secret and random_looking(pair) else None
    flag = group("fval")
    if flag is not None:
        # Data, but usage text names a flag's value too (``--password PASSWORD``): the
        # word must not read as a name.
        secret = _assignment_secret(str(group("fkey")), flag, False, True, is_secret)
        return match.span("fval") if secret else None
    if group("xml") is not None:
        value = str(group("xval"))
        secret = _assignment_secret(str(group("xkey")), value.strip(), True, True, is_secret)
        return match.span("xval") if secret else None
    return _assignment_span(match, group, text, is_secret)


def _assignment_span(
    match: re.Match[str],
    group: Callable[[str], str | None],
    text: str,
    is_secret: Callable[[str], bool],
) -> tuple[int, int] | None:
    name = (
        "dquoted" if group("dq") is not None else "squoted" if group("sq") is not None else "bare"
    )
    quoted = name != "bare"
    sep = str(group("sep"))
    start = match.start()
    if sep in ("==", "!=", "===", "!==") and not quoted:
        return None  # ``password == confirm_password`` compares two variables
    key = str(group("key"))
    key_end = match.end("key")
    if key[:1] in "nrt" and text[match.start("key") - 1 : match.start("key")] == "\\":
        key = key[1:]  # ``'...\nAPI_KEY=...'``: the escape's letter is not the name's
    # The value is data, as a string literal is, after ``?``/``&`` (a query string or form
    # body), ``;`` (a connection string, a cookie), ``-`` (a command-line flag, ``--token=``)
    # and in a ``.env`` or shell line (``GITHUB_TOKEN=...``, ``export PGPASSWORD=...``).
    literal = (
        quoted
        or (start > 0 and text[start - 1] in "?&;-")
        or (sep == "=" and text[key_end : key_end + 1] == "=" and _env_name(key))
    )
    # A header's value (``X-Api-Key: ...``: no name in code holds a ``-``) is no code either,
    # though prose writes such names too (``secret-named: the``).
    data = "-" in key and sep == ":"
    if _assignment_secret(key, str(group(name)), literal, data, is_secret):
        return match.span(name)
    return None


def _env_name(key: str) -> bool:
    return re.fullmatch(_ENV_NAME, key) is not None


def mask(text: str, replacement: str, is_secret: Callable[[str], bool] = is_secret_name) -> str:
    """``text`` with every secret value found by ``spans`` replaced by ``replacement``."""
    parts: list[str] = []
    last = 0
    for start, end in spans(text, is_secret):
        parts.append(text[last:start])
        parts.append(replacement)
        last = end
    if not parts:
        return text
    parts.append(text[last:])
    return "".join(parts)


def found(text: str, is_secret: Callable[[str], bool] = is_secret_name) -> list[str]:
    """The secret values in ``text`` themselves (to be masked by value wherever they recur)."""
    return [text[start:end] for start, end in spans(text, is_secret)]
