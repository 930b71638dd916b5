"""The docs (README.md, docs/*.md, e2e/kind/README.md) name only flags, fields, files, modules
and metrics that exist, and say what is rather than how it came to be.

Each check collects every problem with its document and line, so one run lists them all.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.docs import repo
from tests.docs.markdown import SHELL_FENCES, Doc, Item, anchor, parse

DOCS = {doc.name: doc for doc in (parse(path, repo.ROOT) for path in [*repo.DOCS, *repo.OTHER_DOCS])}

# Flags of other programs that the docs mention on their own, in a code span.
EXTERNAL_FLAGS = {
    "--no-deps",  # pip
    "--build-arg",  # docker build
    "--server-side",  # kubectl apply
    "--recursive",  # kubectl explain
    "--as",  # kubectl auth can-i
    "--optimization-level",  # vllm serve, in runtime.args
    # vLLM's own flags, as the vllm runtime's builder writes them (docs/runtimes.md).
    *re.findall(r'"(--[a-z][\w-]*)"', (repo.ROOT / "src/frota/plan/runtimes/vllm.py").read_text()),
}
# Extensions of names that are this repository's own files even when written bare
# (`paged_attention.cpp`); `.yaml`, `.json`, `.png` bare are usually examples (`out.png`).
BARE_FILE_SUFFIXES = (".py", ".sh", ".cpp", ".md", ".lua")
PATH_SUFFIXES = (*BARE_FILE_SUFFIXES, ".yaml", ".yml", ".json", ".png", ".toml", ".txt")
_PATHISH = re.compile(r"^[\w.\-/*]+$")
_FLAG = re.compile(r"^\[?(--[A-Za-z][\w-]*)")
_SPEC_FIELD = re.compile(r"(?<![\w.$/])((?:spec|status)\.[\w.<>\[\]]+)")
_METRIC = re.compile(r"^(vllm:[a-z_:]+|frota_[a-z0-9_]+)(\{[^}]*\})?$")
_ENV = re.compile(r"^(FROTA_[A-Z0-9_]+)(=.*)?$")
_MODULE = re.compile(r"^frota(\.\w+)+$")


def _fail(problems: list[str]) -> None:
    assert not problems, "\n".join(["the docs name things that do not exist:", *problems])


def _items(doc: Doc, *, shell_only: bool = True) -> list[Item]:
    """Inline code spans, plus the lines of (shell) fences."""
    lines = [item for lang, item in doc.fence_lines if not shell_only or lang in SHELL_FENCES]
    return [*doc.spans, *lines]


def _words(item: Item) -> list[str]:
    return [w.strip("()[],;:'\"") for w in item.text.split()]


def command_problems(doc: Doc) -> list[str]:
    """Flags on `frota ...`, `python -m frota...`, `bench/...` and script command lines."""
    problems = []
    for item in doc.commands:
        words = [w for w in item.text.split() if "=" not in w.split("-")[0]]  # skip VAR=value
        if not words:
            continue
        if words[0] in ("frota", ".venv/bin/frota"):
            path, rest = repo.subcommand(words[1:])
            if rest and not path and not rest[0].startswith("-"):
                problems.append(f"{item.where()}: `frota {rest[0]}` is not a frota subcommand")
                continue
            known = repo.options(repo.frota_parsers()[path])
            label = " ".join(("frota", *path))
        else:
            target = _script_or_module(words)
            if target is None:
                continue
            label, text = target
            if text is None:
                problems.append(f"{item.where()}: `{label}` does not exist")
                continue
            if '"$@"' in text:  # a script passing its arguments on: they are checked elsewhere
                continue
            known = set(re.findall(r"--[A-Za-z][\w-]*", text))
            rest = words
        for word in rest:
            flag = _FLAG.match(word)
            if flag and flag.group(1).split("=")[0] not in known:
                problems.append(f"{item.where()}: `{label}` has no flag {flag.group(1)}")
    return problems


def _script_or_module(words: list[str]) -> tuple[str, str | None] | None:
    """(label, source text or None when missing) of `python -m M`, `python X.py`, `[bash] X.sh`."""
    if words[0] in ("bash", "sh") and len(words) > 1:
        words = words[1:]
    if words[0].endswith("python") or words[0] == "python3":
        if len(words) > 2 and words[1] == "-m":
            if not words[2].startswith(("frota.", "e2e.", "bench")):
                return None  # pytest, pip, ...
            path = repo.module_file(words[2])
            if path is not None and path.is_dir():
                path = path / "__main__.py" if (path / "__main__.py").exists() else path
            return words[2], repo.module_text(path) if path is not None else None
        words = words[1:]
    if words and words[0].endswith((".py", ".sh")) and "/" in words[0]:
        path = repo.ROOT / words[0]
        return words[0], path.read_text(encoding="utf-8") if path.is_file() else None
    return None


def span_flag_problems(doc: Doc) -> list[str]:
    """A flag written alone in a code span must be some command's flag."""
    scripts = {*repo.ROOT.glob("bench/*"), *repo.ROOT.glob("scripts/*"), *repo.ROOT.glob("e2e/**/*.sh")}
    known = repo.all_frota_flags() | EXTERNAL_FLAGS | {
        flag for path in scripts if path.is_file()
        for flag in re.findall(r"--[A-Za-z][\w-]*", path.read_text(encoding="utf-8"))
    }
    problems = []
    for item in doc.spans:
        for part in item.text.split(","):
            flag = _FLAG.match(part.strip())
            if flag and flag.group(1).split("=")[0] not in known:
                problems.append(f"{item.where()}: no command has the flag {flag.group(1)}")
    return problems


def _path_problem(word: str, bases: tuple[Path, ...] = (repo.ROOT,)) -> str | None:
    """Why `word`, if it is a path, names nothing under any of `bases`; else None."""
    relative = word.rstrip(".").removeprefix("./")
    if not _PATHISH.match(relative) or relative.startswith(("-", "/", "..")):
        return None
    if relative.startswith(repo.ignored_prefixes()):
        return None  # a build output
    has_dir = "/" in relative
    top = relative.split("/", 1)[0]
    if not has_dir:
        if relative.endswith(BARE_FILE_SUFFIXES) and "*" not in relative:
            return None if relative in repo.file_names() else "no file of that name in the repository"
        return None
    if not (any((base / top).exists() for base in bases) or relative.endswith(PATH_SUFFIXES)):
        return None  # `frota.dev/role`, `nvidia.com/gpu`: not paths
    if "*" in relative:
        return None if any(any(base.glob(relative)) for base in bases) else "matches no file"
    return None if any((base / relative).exists() for base in bases) else "does not exist"


def path_problems(doc: Doc) -> list[str]:
    """Repository paths in code spans and shell fences must exist, from the repository root
    or, for a doc in a subdirectory (e2e/kind/README.md: `base/Dockerfile`), from its own."""
    bases = tuple(dict.fromkeys((repo.ROOT, doc.path.parent)))
    problems = []
    for item in _items(doc):
        for word in _words(item):
            why = _path_problem(word, bases)
            if why:
                problems.append(f"{item.where()}: path {word} {why}")
    return problems


def link_problems(doc: Doc) -> list[str]:
    """Relative links point at files, and `#anchors` at headings of the target doc."""
    problems = []
    for item in doc.links:
        target = item.text
        if re.match(r"^[a-z]+:", target):
            continue  # https:, mailto:
        file_part, _, fragment = target.partition("#")
        path = (doc.path.parent / file_part).resolve() if file_part else doc.path
        if not path.exists():
            problems.append(f"{item.where()}: link {target} points at no file")
            continue
        if fragment and path.suffix == ".md":
            target_doc = doc if path == doc.path else parse(path, path.parent)
            if fragment not in {anchor(h) for h in target_doc.headings}:
                problems.append(f"{item.where()}: link {target}: no heading with anchor #{fragment}")
    return problems


def field_problems(doc: Doc) -> list[str]:
    """`spec.a.b` and `status.x` must be fields of the InferenceService models."""
    problems = []
    for item in _items(doc, shell_only=False):
        for match in _SPEC_FIELD.finditer(item.text):
            field = match.group(1).rstrip(".")
            why = repo.field_problem(field)
            if why:
                problems.append(f"{item.where()}: field {field}: {why}")
    return problems


def name_problems(doc: Doc) -> list[str]:
    """Modules (`frota.a.b`), metrics and `FROTA_*` variables in code spans must exist."""
    corpus = repo.corpus()
    env_flags = repo.env_of_flags()
    problems = []
    for item in doc.spans:
        for word in item.text.replace("/", " ").split():
            word = word.strip("(),;:'\"`")
            if _MODULE.match(word) and not word.startswith("frota.dev"):
                why = repo.resolve_dotted(word)
                if why:
                    problems.append(f"{item.where()}: {word}: {why}")
            metric = _METRIC.match(word)
            if metric:
                base = re.sub(r"_(total|bucket|sum|count|created)$", "", metric.group(1))
                if base not in corpus:
                    problems.append(f"{item.where()}: metric {metric.group(1)} is exported nowhere")
            env = _ENV.match(word)
            if env and env.group(1) not in corpus and env.group(1) not in env_flags:
                problems.append(f"{item.where()}: environment variable {env.group(1)} is read nowhere")
    return problems


CHECKS = [command_problems, span_flag_problems, path_problems, link_problems, field_problems,
          name_problems]


@pytest.mark.parametrize("check", CHECKS, ids=[c.__name__ for c in CHECKS])
@pytest.mark.parametrize("name", list(DOCS))
def test_docs_name_only_what_exists(name, check):
    _fail(check(DOCS[name]))


BAD_DOC = """\
# A doc with mistakes

Run `frota worker --modle smollm2`, `frota serve` and `python -m frota.api.reference --out x`.
Set `--no-such-flag`, read `scripts/no-such.sh` and `DESIGN.md`, see [there](missing.md)
and [here](#no-such-heading). The field `spec.engine.maxTokens` and `status.nope`, the
module `frota.api.no_such_thing`, the metric `vllm:no_such_metric` and `FROTA_NO_SUCH_VAR`.

```bash
frota router --workers a,b --polcy round-robin
bash scripts/no-such-script.sh
```
"""


def test_each_check_reports_what_it_should(tmp_path):
    path = tmp_path / "bad.md"
    path.write_text(BAD_DOC)
    doc = parse(path, tmp_path)
    found = {check.__name__: "\n".join(check(doc)) for check in CHECKS}
    expected = {
        "command_problems": ["`frota worker` has no flag --modle", "`frota serve` is not a frota",
                             "`frota.api.reference` has no flag --out",
                             "bad.md:9: `frota router` has no flag --polcy",
                             "bad.md:10: `scripts/no-such-script.sh` does not exist"],
        "span_flag_problems": ["no command has the flag --no-such-flag"],
        "path_problems": ["path scripts/no-such.sh does not exist", "path DESIGN.md no file"],
        "link_problems": ["missing.md points at no file", "no heading with anchor #no-such-heading"],
        "field_problems": ["has no field 'maxTokens'", "field status.nope"],
        "name_problems": ["frota.api.no_such_thing: module frota.api defines no no_such_thing",
                          "metric vllm:no_such_metric", "FROTA_NO_SUCH_VAR is read nowhere"],
    }
    for check, fragments in expected.items():
        for fragment in fragments:
            assert fragment in found[check], f"{check} missed {fragment!r}: {found[check]}"


# Wording that tells how the project came to be, or about one machine on one day, rather
# than what is. Each is precise enough that the docs' ordinary wording does not match it
# ("no longer than", "the previous turn", the `session` policy, "this machine has 0").
HISTORY_PHRASES = [
    r"previously", r"formerly", r"previous server", r"used to be", r"no longer(?! than)",
    r"before its rewrite", r"was rewritten", r"as before", r"until recently", r"anymore",
    r"for now", r"today", r"that day", r"same day", r"this session", r"this machine's",
    r"measured here", r"development machine", r"ha(?:s|ve) not (?:yet )?(?:been )?run",
    r"not [^.;:()]{0,60}?yet",  # "not yet run", "does not refuse such a spec yet"
]
_HISTORY = re.compile(r"\b(?:" + "|".join(HISTORY_PHRASES) + r")\b", re.IGNORECASE)

def history_problems(doc: Doc) -> list[str]:
    """Every development-history phrase of the doc, with its line (also across line breaks)."""
    text = doc.path.read_text(encoding="utf-8")
    problems = []
    for match in _HISTORY.finditer(text.replace("\n", " ")):  # same offsets as `text`
        line = text.count("\n", 0, match.start()) + 1
        problems.append(f"{doc.name}:{line}: {match.group(0)!r}")
    return problems


@pytest.mark.parametrize("name", list(DOCS))
def test_docs_say_what_is_not_how_it_came_to_be(name):
    problems = history_problems(DOCS[name])
    assert not problems, "\n".join([
        "development history or one machine's noise; say what is, and where a figure was measured:",
        *problems])


def test_history_detector_catches_history_and_spares_plain_wording(tmp_path):
    path = tmp_path / "history.md"
    path.write_text(
        "The router was 37% before its rewrite, and on this machine that day so did the\n"
        "previous server. The CUDA paths have not yet been run on GPU hardware. The relay\n"
        "writes each chunk as before; tokens no longer stall. The planner does not refuse\n"
        "such a spec yet.\n\n"
        "Names are no longer than 40 characters. The `session` policy keeps a chat's previous\n"
        "turn on its worker; nothing had reached the client yet. `frota up` runs on this\n"
        "machine, and refuses with `this machine has 0`. The script rewrites archives.\n")
    found = "\n".join(history_problems(parse(path, tmp_path)))
    for fragment in ["history.md:1: 'before its rewrite'", "history.md:1: 'that day'",
                     "history.md:2: 'previous server'", "history.md:2: 'have not yet been run'",
                     "history.md:3: 'as before'", "history.md:3: 'no longer'",
                     "history.md:3: 'not refuse such a spec yet'"]:
        assert fragment in found, f"missed {fragment!r}: {found}"
    assert not any(f"history.md:{line}:" in found for line in (5, 6, 7)), found


def test_readme_starts_with_the_two_commands():
    head = (repo.ROOT / "README.md").read_text().splitlines()[:20]
    assert "scripts/up.sh      # install into .venv, then serve SmolLM2 on localhost:8000 (a local fleet)" in head
    assert "scripts/test.sh    # install into .venv, then run the whole test suite (what CI runs)" in head


def test_readme_is_short_and_links_every_doc():
    readme = DOCS["README.md"]
    assert len(readme.path.read_text().splitlines()) <= 250, "README.md: keep it short, move detail to docs/"
    linked = {item.text.partition("#")[0] for item in readme.links}
    missing = [p.name for p in repo.DOCS[1:] if f"docs/{p.name}" not in linked]
    assert missing == [], f"README.md links no docs/{missing}"


def test_field_map_names_every_top_level_spec_field():
    from frota.api import InferenceServiceSpec

    text = DOCS["docs/operations.md"].path.read_text()
    section = text[text.index("### The fields at a glance"):]
    section = section[:section.index("\n## ")]
    missing = [name for name in InferenceServiceSpec.model_fields if f"`spec.{name}" not in section]
    assert missing == [], f"docs/operations.md, 'The fields at a glance', misses spec.{missing}"
