"""Which prebuilt ISA level of the C++ kernels a CPU loads (frota.engine.kernels.isa / prebuilt)."""

import json
import logging
import platform

import pytest
import torch

from frota.engine.kernels import isa, prebuilt

V2 = {"cx16", "lahf_lm", "popcnt", "pni", "sse4_1", "sse4_2", "ssse3", "sse", "sse2", "fpu"}
V3 = V2 | {"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave"}
V4 = V3 | {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}
ALL = [level.name for level in isa.LEVELS]


def test_levels_are_ordered_best_first_and_each_contains_the_next():
    for better, worse in zip(isa.LEVELS, isa.LEVELS[1:], strict=False):
        assert worse.cpu_flags < better.cpu_flags
    assert all("-march=native" not in level.cflags for level in isa.LEVELS)


def test_parse_cpu_flags_reads_the_first_flags_line():
    text = "processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: fpu sse2 avx2\n\nprocessor\t: 1\nflags\t: fpu\n"
    assert isa.parse_cpu_flags(text) == {"fpu", "sse2", "avx2"}
    assert isa.parse_cpu_flags("Features\t: fp asimd\n") == frozenset()  # an arm64 cpuinfo


@pytest.mark.parametrize(("flags", "want"), [
    (V4 | {"avx512_bf16"}, "x86-64-v4-bf16"),  # Sapphire Rapids, Zen 4
    (V4, "x86-64-v4"),  # Skylake-SP, Ice Lake
    (V3, "x86-64-v3"),  # Haswell .. Alder Lake, Zen 1-3
    (V4 - {"avx512vl"}, "x86-64-v3"),  # a partial AVX-512 is no v4
    (V3 - {"movbe"}, "x86-64-v2"),
    (V2, "x86-64-v2"),
    ({"sse", "sse2"}, None),  # older than v2: nothing prebuilt runs
])
def test_the_best_runnable_built_level_is_chosen(flags, want):
    level = isa.choose_level(ALL, frozenset(flags))
    assert (level.name if level else None) == want


def test_only_built_levels_are_chosen():
    flags = frozenset(V4 | {"avx512_bf16"})
    assert isa.choose_level(["x86-64-v2", "x86-64-v3"], flags).name == "x86-64-v3"
    assert isa.choose_level(["x86-64-v4"], frozenset(V3)) is None
    assert isa.choose_level([], flags) is None


def test_torch_capability_stands_in_for_an_unreadable_cpuinfo():
    assert isa.choose_level(ALL, None, torch_capability="AVX512").name == "x86-64-v4"
    assert isa.choose_level(ALL, None, torch_capability="AVX2").name == "x86-64-v3"
    assert isa.choose_level(["x86-64-v2"], None, torch_capability="AVX2").name == "x86-64-v2"
    assert isa.choose_level(ALL, None, torch_capability="DEFAULT") is None


def test_an_override_picks_a_built_level_and_rejects_unknown_ones():
    assert isa.choose_level(ALL, frozenset(V4), override="x86-64-v2").name == "x86-64-v2"
    assert isa.choose_level(["x86-64-v3"], frozenset(V4), override="x86-64-v2") is None
    with pytest.raises(ValueError, match="unknown ISA level"):
        isa.choose_level(ALL, frozenset(V4), override="native")


def test_the_host_cpu_runs_some_level_on_x86():
    if not isa.is_x86_64():
        pytest.skip("the ISA levels are x86-64's")
    flags = isa.host_cpu_flags()
    assert flags is None or isa.runnable(flags), "a CPU that runs torch runs x86-64-v2"


@pytest.fixture
def prebuilt_dir(tmp_path, monkeypatch):
    """A FROTA_KERNELS_DIR with a manifest for this torch (no modules: choice only)."""
    def write(**overrides):
        manifest = {"torch": torch.__version__, "machine": platform.machine(),
                    "sources": {kind: prebuilt.source_digest(kind) for kind in prebuilt.KINDS},
                    "levels": ALL, **overrides}
        (tmp_path / "manifest.json").write_text(json.dumps(manifest))
        prebuilt._chosen.cache_clear()
        return tmp_path

    monkeypatch.setenv(prebuilt.DIR_ENV, str(tmp_path))
    monkeypatch.delenv(prebuilt.ISA_ENV, raising=False)
    monkeypatch.setattr(isa, "host_cpu_flags", lambda: frozenset(V3))
    yield write
    prebuilt._chosen.cache_clear()


def test_the_chosen_level_is_logged(prebuilt_dir, caplog):
    root = prebuilt_dir()
    with caplog.at_level(logging.INFO, logger="frota.engine.kernels"):
        assert prebuilt.chosen_level() == "x86-64-v3"
    assert f"using the prebuilt x86-64-v3 build (the best this CPU runs of {', '.join(ALL)}) from {root}" \
        in caplog.text


def test_the_module_path_is_per_level_and_kind(prebuilt_dir):
    root = prebuilt_dir()
    module = root / "x86-64-v3" / "frota_quant_x86_64_v3.so"
    assert prebuilt.path("quant") is None  # not built
    module.parent.mkdir()
    module.write_bytes(b"")
    assert prebuilt.path("quant") == module


def test_the_override_env_forces_a_level(prebuilt_dir, monkeypatch):
    prebuilt_dir()
    monkeypatch.setenv(prebuilt.ISA_ENV, "x86-64-v2")
    assert prebuilt.chosen_level() == "x86-64-v2"


@pytest.mark.parametrize("manifest", [
    {"torch": "1.0.0"},  # another torch: another ABI
    {"machine": "aarch64"},
    {"levels": ["x86-64-v4"]},  # nothing this (v3) CPU runs
])
def test_prebuilt_kernels_that_do_not_fit_are_not_used(prebuilt_dir, manifest, caplog):
    prebuilt_dir(**manifest)
    with caplog.at_level(logging.WARNING, logger="frota.engine.kernels"):
        assert prebuilt.chosen_level() is None
        assert prebuilt.path("attention") is None
    assert "building for this CPU" in caplog.text


def test_prebuilt_kernels_from_other_sources_are_not_used(prebuilt_dir, caplog):
    root = prebuilt_dir(sources={"attention": "0" * 16, "quant": prebuilt.source_digest("quant")})
    for kind in prebuilt.KINDS:
        (root / "x86-64-v3").mkdir(exist_ok=True)
        (root / "x86-64-v3" / f"{prebuilt.module_name(kind, isa.BY_NAME['x86-64-v3'])}.so").write_bytes(b"")
    with caplog.at_level(logging.WARNING, logger="frota.engine.kernels"):
        assert prebuilt.path("attention") is None
        assert prebuilt.path("quant") is not None
    assert "built from other sources" in caplog.text


def test_without_the_env_nothing_prebuilt_is_used(monkeypatch):
    monkeypatch.delenv(prebuilt.DIR_ENV, raising=False)
    prebuilt._chosen.cache_clear()
    assert prebuilt.chosen_level() is None and prebuilt.load("attention") is None


def test_prebuilt_flags_replace_march_native():
    from frota.engine.kernels.extensions import EXTENSIONS

    level = isa.BY_NAME["x86-64-v4-bf16"]
    assert prebuilt._portable(EXTENSIONS["attention"].cflags, level) == [
        "-O3", "-march=x86-64-v4", "-mavx512bf16", "-ffast-math", "-fopenmp"]
    assert prebuilt._portable(EXTENSIONS["quant"].cflags, isa.BY_NAME["x86-64-v2"]) == [
        "-O3", "-march=x86-64-v2", "-fopenmp"]


def test_prebuild_elsewhere_than_x86_writes_an_empty_manifest(tmp_path, monkeypatch):
    monkeypatch.setattr(isa, "is_x86_64", lambda machine=None: False)
    assert prebuilt.prebuild(tmp_path) == []
    assert json.loads((tmp_path / "manifest.json").read_text())["levels"] == []


@pytest.mark.parametrize(("flags", "vendor", "want"), [
    (V4 | {"avx512_bf16"}, "AuthenticAMD", torch.bfloat16),
    (V4 | {"avx512_bf16", "amx_bf16", "amx_tile"}, "GenuineIntel", torch.bfloat16),
    # AVX-512 BF16 without AMX on Intel: vdpbf16ps does no more per cycle than the FMAs
    (V4 | {"avx512_bf16"}, "GenuineIntel", torch.float32),
    (V4, "AuthenticAMD", torch.float32),  # no BF16: bfloat16 would be emulated, and slower
    (frozenset(), None, torch.float32),
])
def test_dtype_auto_on_a_cpu_is_bfloat16_only_where_it_is_the_faster_one(flags, vendor, want):
    from frota.engine.compute import resolve_dtype

    cpu = {"cpu_flags": frozenset(flags), "cpu_vendor": vendor}
    assert resolve_dtype("auto", torch.device("cpu"), **cpu) == want
    assert resolve_dtype("float32", torch.device("cpu"), **cpu) == torch.float32
    assert resolve_dtype("auto", torch.device("cuda"), **cpu) == torch.bfloat16


def test_the_cpu_vendor_is_read_from_cpuinfo():
    text = "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu avx512_bf16\n"
    assert isa.parse_cpu_vendor(text) == "AuthenticAMD"
    assert isa.parse_cpu_vendor("processor\t: 0\n") is None


def test_the_start_up_line_says_which_dtype_was_chosen_and_why():
    from frota.engine.compute import describe_compute

    line = describe_compute("auto", torch.float32, torch.device("cpu"))
    assert line.startswith("float32 (auto: this CPU ")
    assert "kernels" in line or "PyTorch attention" in line
    assert describe_compute("bfloat16", torch.bfloat16, torch.device("cpu")).startswith("bfloat16; ")
