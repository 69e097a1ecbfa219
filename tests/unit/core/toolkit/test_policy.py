"""The toolkit choice policy (toolkit/policy.py) and its messages (toolkit/fixes.py)."""

import pickle

import pytest
from packaging.version import Version

from helpers.toolkits import make_toolkit
from flashinfer_sm120.core.facts import arch, archopt
from flashinfer_sm120.errors import FormatError, ToolkitError
from flashinfer_sm120.core.toolkit.policy import choose
from flashinfer_sm120.core.toolkit.sources import discover
from flashinfer_sm120.core.toolkit.probe import inspect
from flashinfer_sm120.core.toolkit import fixes
from flashinfer_sm120.core.toolkit.model import RejectKind, Toolkit
from flashinfer_sm120.core.toolkit.fixes import ALLOW_OTHER_MAJOR_ENV, unbuildable
from flashinfer_sm120.core.toolkit.policy import other_major_allowed


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHINFER_SM120_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(ALLOW_OTHER_MAJOR_ENV, raising=False)


def fake(version, source, root=None, problem=None):
    """A Toolkit as discover() would return it, without files (fast)."""
    mm = ".".join(version.split(".")[:2])
    root = root or {"pip": "/site-packages/nvidia/cu13", "CUDA_HOME": f"/opt/cuda-{mm}",
                    "/usr/local/cuda": "/usr/local/cuda", "PATH": f"/usr/lib/cuda-{mm}",
                    "versioned": f"/usr/local/cuda-{mm}"}[source]
    return Toolkit(root=root, nvcc=f"{root}/bin/nvcc", sources=(source,), nvcc_version=Version(mm),
                   nvcc_full=version, header_version=Version(mm), version_from="version.json",
                   include_dirs=(f"{root}/include",), lib_dir=f"{root}/lib", problem=problem)


# --------------------------------------------------------------------------- the matrix

SETS = {
    "pip13": lambda: [fake("13.5.1", "pip")],
    "sys128": lambda: [fake("12.8.93", "/usr/local/cuda")],
    "home129+pip13": lambda: [fake("12.9.41", "CUDA_HOME"), fake("13.0.88", "pip")],
    "none": lambda: [],
    "home126": lambda: [fake("12.6.85", "CUDA_HOME")],
}
CAPS = {"8.9": [(8, 9)], "9.0": [(9, 0)], "10.0": [(10, 0)], "12.0": [(12, 0)], "12.1": [(12, 1)],
        "12.0+8.9": [(12, 0), (8, 9)], "15.0": [(15, 0)]}
COLS = list(CAPS)

# Expected outcome per (torch CUDA, toolkit set) row, one column per capability set.
# "S:t,t" = chosen toolkit of that source with those targets (sm_ omitted);
# "!code" = refused with exactly the fix line FIX[code].
# H = CUDA_HOME, P = pip, U = /usr/local/cuda.
TABLE = """
torch set            8.9      9.0      10.0      12.0      12.1      12.0+8.9     15.0
None  pip13          P:89     P:90a    P:100a    P:120f    P:121a    P:89,120f    !up
None  sys128         U:89     U:90a    U:100a    U:120a    !pip13    U:89,120a    !up
None  home129+pip13  H:89     H:90a    H:100a    H:120f    H:121a    H:89,120f    !up
None  none           !pip13   !pip13   !pip13    !pip13    !pip13    !pip13       !up
None  home126        H:89     H:90a    !pip13    !pip13    !pip13    !pip13       !up
12.6  pip13          !c12.6   !c12.6   !c12.8    !c12.9    !c12.9    !c12.9       !up
12.6  sys128         U:89     U:90a    U:100a    U:120a    !c12.9    U:89,120a    !up
12.6  home129+pip13  H:89     H:90a    H:100a    H:120f    H:121a    H:89,120f    !up
12.6  none           !c12.6   !c12.6   !c12.8    !c12.9    !c12.9    !c12.9       !up
12.6  home126        H:89     H:90a    !c12.8    !c12.9    !c12.9    !c12.9       !up
12.8  pip13          !c12.8   !c12.8   !c12.8    !c12.9    !c12.9    !c12.9       !up
12.8  sys128         U:89     U:90a    U:100a    U:120a    !c12.9    U:89,120a    !up
12.8  home129+pip13  H:89     H:90a    H:100a    H:120f    H:121a    H:89,120f    !up
12.8  none           !c12.8   !c12.8   !c12.8    !c12.9    !c12.9    !c12.9       !up
12.8  home126        H:89     H:90a    !c12.8    !c12.9    !c12.9    !c12.9       !up
12.9  pip13          !c12.9   !c12.9   !c12.9    !c12.9    !c12.9    !c12.9       !up
12.9  sys128         U:89     U:90a    U:100a    U:120a    !c12.9    U:89,120a    !up
12.9  home129+pip13  H:89     H:90a    H:100a    H:120f    H:121a    H:89,120f    !up
12.9  none           !c12.9   !c12.9   !c12.9    !c12.9    !c12.9    !c12.9       !up
12.9  home126        H:89     H:90a    !c12.9    !c12.9    !c12.9    !c12.9       !up
13.0  pip13          P:89     P:90a    P:100a    P:120f    P:121a    P:89,120f    !up
13.0  sys128         !p13.0   !p13.0   !p13.0    !p13.0    !p13.0    !p13.0       !up
13.0  home129+pip13  P:89     P:90a    P:100a    P:120f    P:121a    P:89,120f    !up
13.0  none           !p13.0   !p13.0   !p13.0    !p13.0    !p13.0    !p13.0       !up
13.0  home126        !p13.0   !p13.0   !p13.0    !p13.0    !p13.0    !p13.0       !up
"""


def _conda(v):
    return (f"install CUDA {v} from NVIDIA (https://developer.nvidia.com/cuda-toolkit-archive) or conda "
            f"(conda install -c nvidia cuda-toolkit={v}) and set CUDA_HOME to it, or use a CUDA 13 build "
            f"of torch; no pip wheel before CUDA 13.0 ships nvcc")


FIX = {
    "pip13": "pip install 'cuda-toolkit[nvcc,cccl,curand]>=13.0,<14'",
    "p13.0": "pip install 'cuda-toolkit[nvcc,cccl,curand]==13.0.*'",
    "c12.6": _conda("12.6"), "c12.8": _conda("12.8"), "c12.9": _conda("12.9"),
    "up": ("upgrade flashinfer-sm120 (this release's target table does not know sm_150a); until "
           "then, if `nvcc --list-gpu-arch` lists it, FLASHINFER_CUDA_ARCH_LIST='15.0a' with an nvcc >= "
           "13.0 builds it as given"),
}
SRC = {"H": "CUDA_HOME", "P": "pip", "U": "/usr/local/cuda"}


def _cells():
    rows = [r.split() for r in TABLE.strip().splitlines()[1:]]
    for torch_cuda, set_name, *cols in rows:
        assert len(cols) == len(COLS), (torch_cuda, set_name)
        for cap_name, expect in zip(COLS, cols):
            yield pytest.param(None if torch_cuda == "None" else torch_cuda, set_name, cap_name, expect,
                               id=f"torch{torch_cuda}-{set_name}-{cap_name}")


@pytest.mark.parametrize("torch_cuda, set_name, cap_name, expect", list(_cells()))
def test_choice_matrix(torch_cuda, set_name, cap_name, expect):
    toolkits = SETS[set_name]()
    if expect.startswith("!"):
        with pytest.raises(ToolkitError) as exc:
            choose(toolkits, None, CAPS[cap_name], torch_cuda)
        err = exc.value
        assert err.fix == FIX[expect[1:]]
        msg = str(err)
        assert msg.splitlines()[-1] == f"Fix: {err.fix}" and msg.count("Fix:") == 1
        for tk in toolkits:  # what was found, each with why it was rejected
            assert tk.label in msg
        assert "sm75" not in msg
        # never a pip toolkit before 13.0 (no such wheel ships nvcc)
        assert "cuda-toolkit[nvcc,cccl,curand]==12" not in msg and ">=12." not in err.fix
        return
    src, targets = expect.split(":")
    ch = choose(toolkits, None, CAPS[cap_name], torch_cuda)
    assert ch.toolkit.sources[0] == SRC[src]
    assert sorted(arch.format_target(t) for t in ch.targets) == sorted(f"sm_{t}" for t in targets.split(","))
    if torch_cuda:
        assert ch.toolkit.nvcc_version.major == Version(torch_cuda).major
    assert all(arch.target_supported(t, ch.version) for t in ch.targets)


# --------------------------------------------------------------------------- messages (issue 6 item 3)

def test_fix_pins_torch_minor_for_cu13():
    with pytest.raises(ToolkitError) as exc:
        choose([fake("12.8.93", "CUDA_HOME")], None, [(12, 0)], "13.2")
    assert exc.value.fix == "pip install 'cuda-toolkit[nvcc,cccl,curand]==13.2.*'"


def test_sm121_with_only_128_names_129_even_when_the_major_is_wrong_too():
    with pytest.raises(ToolkitError) as exc:
        choose([fake("12.8.93", "CUDA_HOME")], None, [(12, 1)], "13.0")
    msg = str(exc.value)
    line = next(ln for ln in msg.splitlines() if "/opt/cuda-12.8" in ln)
    assert "nvcc 12.8 cannot build sm_121a (nvcc >= 12.9)" in line and "CUDA 12, but torch is built for CUDA 13.0" in line
    assert "sm_121a: nvcc >= 12.9" in msg and "compute capability 12.1" in msg


def test_cu12_torch_never_gets_a_pip_12_toolkit():
    for torch_cuda in ("12.8", "12.9"):
        with pytest.raises(ToolkitError) as exc:
            choose([fake("13.0.88", "pip")], None, [(12, 1)], torch_cuda)
        last = str(exc.value).splitlines()[-1]
        assert last.startswith("Fix: install CUDA 12.9") and "cuda-toolkit[" not in last
        assert "cuda-toolkit[" not in exc.value.fix and "nvidia/cu13" not in exc.value.fix
        assert "CUDA 12.9" in exc.value.fix and "conda install -c nvidia cuda-toolkit=12.9" in exc.value.fix
        assert "CUDA 13 build of torch" in exc.value.fix


def test_cu12_torch_with_a_target_only_cuda13_builds_says_use_cu13_torch():
    with pytest.raises(ToolkitError) as exc:
        choose([fake("12.9.41", "CUDA_HOME")], None, [(11, 0)], "12.9")
    assert exc.value.fix.startswith("use a torch built for CUDA 13 (e.g. pip install torch --index-url "
                                    "https://download.pytorch.org/whl/cu130)")
    assert "'cuda-toolkit[nvcc,cccl,curand]==13.0.*'" in exc.value.fix and "nvcc >= 13.0" in exc.value.fix


def test_unknown_future_gpu_says_upgrade_not_an_installed_pip_toolkit():
    for torch_cuda in (None, "13.0"):
        with pytest.raises(ToolkitError) as exc:
            choose([fake("13.0.88", "pip")], arch.parse_arch_list("15.0"), [], torch_cuda)
        assert str(exc.value).splitlines()[-1].startswith("Fix: upgrade flashinfer-sm120")
        assert exc.value.fix.startswith("upgrade flashinfer-sm120")
        assert "FLASHINFER_CUDA_ARCH_LIST='15.0a'" in exc.value.fix


@pytest.mark.parametrize("typed, read, fix", [
    ("5.0", "5.0", "remove '5.0' from --arch (CUDA 13.0 dropped sm_50)"),
    ("99", "9.9", "if `nvcc --list-gpu-arch` lists it, --arch 9.9a with an nvcc"),
])
def test_a_target_given_by_arch_is_named_as_typed_with_the_flag_in_the_error_and_the_fix(
        monkeypatch, typed, read, fix):
    """doctor --arch 5.0 and --arch 99 blamed FLASHINFER_CUDA_ARCH_LIST, which the user never set."""
    monkeypatch.setenv("FLASHINFER_CUDA_ARCH_LIST", "")  # restored after the test
    archopt.export_arch_list(typed)
    with pytest.raises(ToolkitError) as exc:
        choose([fake("13.0.88", "pip")], arch.parse_arch_list(read), [], "13.0")
    assert fix in exc.value.fix and "FLASHINFER_CUDA_ARCH_LIST" not in str(exc.value), str(exc.value)
    assert f"(--arch '{typed}'" in str(exc.value) and (typed == read or f"read as {read}" in str(exc.value))
    monkeypatch.setenv("FLASHINFER_CUDA_ARCH_LIST", read + " 12.0")  # a server's own variable: named as such
    with pytest.raises(ToolkitError) as exc:
        choose([fake("13.0.88", "pip")], arch.parse_arch_list(read), [], "13.0")
    assert "FLASHINFER_CUDA_ARCH_LIST" in exc.value.fix and "--arch" not in str(exc.value)


def test_a_decimal_comma_in_arch_says_what_was_typed_and_the_accepted_forms():
    """--arch 12,0 blamed only '0'."""
    with pytest.raises(arch.ArchListError) as exc:
        arch.parse_arch_list("12,0", source="--arch")
    msg = str(exc.value)
    assert msg.startswith("--arch='12,0' (read as 2 entries, '12', '0')") and "Did you mean '12.0'?" in msg
    assert "'12.0,12.1' or '12.0 12.1'" in msg


def test_installed_pip_fix_is_never_printed():
    broken = fake("13.0.88", "pip", problem="nvcc 13.0 with CUDA headers 13.5")
    with pytest.raises(ToolkitError) as exc:
        choose([broken], None, [(12, 0)], "13.0")
    fix = exc.value.fix
    assert fix.startswith("repair the pip toolkit at /site-packages/nvidia/cu13 (nvcc 13.0 with CUDA headers 13.5)")
    assert "--force-reinstall" in fix
    # a clean pip 13.0 that still cannot build (a target newer than it) gets a newer pin
    assert fixes.toolkit_fix(Version("13.2"), "13.0", [fake("13.0.88", "pip")]) == \
        "pip install 'cuda-toolkit[nvcc,cccl,curand]==13.2.*'"
    assert fixes.toolkit_fix(Version("13.0"), "13.0", [fake("13.0.88", "pip")]) == \
        "pip install 'cuda-toolkit[nvcc,cccl,curand]>=13.1,<14'"


def test_release_minimum_nvcc_is_the_reason_and_is_named():
    why = "FlashInfer 0.6.18+ passes --compress-mode=size (flashinfer/jit/cpp_ext.py)"
    with pytest.raises(ToolkitError) as exc:
        choose([fake("12.6.85", "CUDA_HOME")], None, [(9, 0)], "12.6", min_nvcc=Version("12.8"), min_nvcc_why=why)
    msg = str(exc.value)
    assert "nvcc 12.6 is older than 12.8, needed because " + why in msg
    assert "nvcc >= 12.8 because " + why in msg
    assert exc.value.fix == _conda("12.8")
    ch = choose([fake("12.8.93", "CUDA_HOME")], None, [(9, 0)], "12.6", min_nvcc=Version("12.8"), min_nvcc_why=why)
    assert ch.targets == ((9, "0a"),)


def test_toolkit_error_carries_fix_and_survives_pickling():
    with pytest.raises(ToolkitError) as exc:
        choose([], None, [(12, 0)], "13.0")
    again = pickle.loads(pickle.dumps(exc.value))
    assert again.fix == exc.value.fix and str(again) == str(exc.value)
    assert "none: searched CUDA_HOME" in str(exc.value)
    fmt = FormatError("m.json: bad; Fix: redo", source="m.json", problem="bad", fix="redo")
    back = pickle.loads(pickle.dumps(fmt))
    assert (str(back), back.source, back.problem, back.fix) == (str(fmt), "m.json", "bad", "redo")


def test_arch_list_is_named_in_the_refusal():
    with pytest.raises(ToolkitError) as exc:
        choose([fake("12.8.93", "CUDA_HOME")], arch.parse_arch_list("12.0f"), [(12, 0)], "12.8")
    msg = str(exc.value)
    assert "FLASHINFER_CUDA_ARCH_LIST='12.0f'" in msg and "GPUs: compute capability 12.0" in msg
    assert "nvcc 12.8 cannot build sm_120f (nvcc >= 12.9)" in msg


# --------------------------------------------------------------------------- other majors, CPU torch

def test_other_major_only_with_explicit_opt_in(monkeypatch):
    pip13 = [fake("13.0.88", "pip")]
    with pytest.raises(ToolkitError) as exc:
        choose(pip13, None, [(12, 0)], "12.8")
    assert f"{ALLOW_OTHER_MAJOR_ENV}=1" in str(exc.value)  # the opt-in is named, not the fix
    ch = choose(pip13, None, [(12, 0)], "12.8", allow_other_major=True)
    assert ch.targets == ((12, "0f"),) and ALLOW_OTHER_MAJOR_ENV in ch.reason
    monkeypatch.setenv(ALLOW_OTHER_MAJOR_ENV, "1")
    assert choose(pip13, None, [(12, 0)], "12.8").toolkit is pip13[0]
    monkeypatch.setenv(ALLOW_OTHER_MAJOR_ENV, "0")
    with pytest.raises(ToolkitError):
        choose(pip13, None, [(12, 0)], "12.8")
    assert other_major_allowed({ALLOW_OTHER_MAJOR_ENV: "yes"}) and not other_major_allowed({})
    assert not other_major_allowed({ALLOW_OTHER_MAJOR_ENV: " Off "})


def test_torch_major_is_preferred_over_opt_in_other_major():
    tks = [fake("13.0.88", "pip"), fake("12.8.93", "/usr/local/cuda")]
    ch = choose(tks, None, [(12, 0)], "12.8", allow_other_major=True)
    # fallback sm_120a with torch's major beats sm_120f with another major
    assert ch.toolkit is tks[1] and ch.targets == ((12, "0a"),)


def test_cpu_torch_prefers_cuda13_but_keeps_explicit_cuda_home():
    path129, usr13 = fake("12.9.41", "PATH"), fake("13.0.88", "versioned")
    ch = choose([path129, usr13], None, [(12, 0)], None)
    assert ch.toolkit is usr13
    rej = {r.toolkit.root: r for r in ch.rejected}[path129.root]
    assert rej.kind is RejectKind.USABLE and "CPU-only torch a CUDA 13+ toolkit" in rej.reason
    home = fake("12.9.41", "CUDA_HOME")
    assert choose([home, fake("13.0.88", "pip")], None, [(12, 0)], None).toolkit is home
    assert choose([path129], None, [(12, 0)], None).toolkit is path129


# --------------------------------------------------------------------------- unbuildable

def test_flashinfer_own_toolkit_is_kept_when_it_builds_every_target_and_fits_torch():
    """What FlashInfer alone gets right is not replaced (issue 29 item 7; P1 still holds: it must pass)."""
    own = fake("13.0.88", "PATH")
    for torch_cuda in (None, "13.0"):
        ch = choose([fake("13.5.1", "pip"), own], None, [(12, 0)], torch_cuda, own=own.nvcc)
        assert ch.toolkit is own and ch.targets == ((12, "0f"),), ch.reason
        assert ch.reason.startswith("FlashInfer's own toolkit (PATH), kept")
        ch = choose([fake("13.5.1", "pip"), own], None, [(12, 0)], torch_cuda)  # not FlashInfer's: order wins
        assert ch.toolkit.sources == ("pip",)


@pytest.mark.parametrize("source, refused", [
    ("CUDA_HOME", fake("12.8.93", "CUDA_HOME", "/opt/nope", problem="$CUDA_HOME=/opt/nope: directory does not exist")),
    ("CUDA_PATH", fake("12.8.93", "CUDA_HOME", "/opt/cuda-12.8")),  # a real toolkit that cannot build sm_121a
    ("FLASHINFER_NVCC", fake("12.8.93", "CUDA_HOME", "/opt/nope", problem="no executable bin/nvcc")),
])
@pytest.mark.parametrize("torch_cuda", [None, "13.0"])
def test_a_refused_toolkit_setting_leaves_the_choice_as_without_it(source, refused, torch_cuda):
    """CUDA_HOME=/opt/nope moved the choice from the system CUDA 13.0 (FlashInfer's own, through PATH) to pip's
    13.5: FlashInfer's own toolkit was looked for only with the refused setting (P1, P8)."""
    refused = Toolkit(**dict(vars(refused), sources=(source,)))
    own = fake("13.0.88", "PATH")
    without = choose([fake("13.5.1", "pip"), own], None, [(12, 1)], torch_cuda, own=own.nvcc)
    ch = choose([refused, fake("13.5.1", "pip"), own], None, [(12, 1)], torch_cuda, own=None, own_unset=own.nvcc)
    assert ch.toolkit is own is without.toolkit, ch.reason
    assert ch.reason.startswith(f"FlashInfer's own toolkit without {source} (PATH), kept"), ch.reason
    (lost,) = [r for r in ch.rejected if r.toolkit is refused]
    assert lost.kind is RejectKind.UNUSABLE and lost.why, lost
    usable = fake("13.0.88", "CUDA_HOME", "/opt/cuda-13.0")  # a setting that is used keeps its toolkit
    usable = Toolkit(**dict(vars(usable), sources=(source,)))
    assert choose([usable, fake("13.5.1", "pip"), own], None, [(12, 1)], torch_cuda,
                  own_unset=own.nvcc).toolkit is usable


@pytest.mark.parametrize("own_version, caps, torch_cuda", [
    ("12.8.93", [(12, 0)], None),     # CPU torch: a 12.x is not kept over CUDA 13 (no sm_120f)
    ("12.8.93", [(12, 1)], "12.8"),   # cannot build sm_121 at all
    ("13.0.88", [(12, 0)], "12.8"),   # not torch's CUDA major
])
def test_flashinfer_own_toolkit_is_replaced_when_it_falls_short(own_version, caps, torch_cuda):
    own = fake(own_version, "PATH")
    others = [fake("13.5.1", "pip"), fake("12.9.41", "versioned")]
    ch = choose([*others, own], None, caps, torch_cuda, own=own.nvcc)
    assert ch.toolkit is not own and not ch.reason.startswith("FlashInfer's own"), ch.reason


def test_unbuildable_refuses_120f_on_128_with_the_fallback_as_fix():
    (msg,) = unbuildable([(12, "0f")], Version("12.8"))
    assert "sm_120f cannot be built by nvcc 12.8 (sm_120f needs nvcc >= 12.9)" in msg
    assert "'12.0a'" in msg and "nvcc >= 12.9" in msg
    assert unbuildable([(12, "0f"), (12, "0a")], Version("12.9")) == []


def test_unbuildable_dropped_renamed_and_unknown_targets():
    (m,) = unbuildable([(10, "1a")], Version("13.0"))
    assert "write '11.0a' instead of '10.1a'" in m
    (m,) = unbuildable([(7, "0")], Version("13.0"))
    assert "remove '7.0'" in m and "dropped sm_70" in m
    (m,) = unbuildable([(12, "1a")], Version("12.8"))
    assert m.endswith("Fix: use a toolkit with nvcc >= 12.9 (set CUDA_HOME to it).")
    (m,) = unbuildable([(15, "0a")], Version("12.9"))
    assert "upgrade" not in m or "upgrade flashinfer-sm120" in m
    assert "upgrade flashinfer-sm120" in m
    assert unbuildable([(15, "0a")], Version("13.0")) == []  # the escape hatch: taken as given


def test_explicit_unknown_target_is_the_escape_hatch():
    ch = choose([fake("13.5.1", "pip")], arch.parse_arch_list("15.0a"), [], "13.0")
    assert ch.targets == ((15, "0a"),) and "used as given in FLASHINFER_CUDA_ARCH_LIST" in ch.reason
    with pytest.raises(ToolkitError) as exc:
        choose([fake("12.9.41", "CUDA_HOME")], arch.parse_arch_list("15.0a"), [], "12.9")
    assert exc.value.fix.startswith("upgrade flashinfer-sm120")
    # a newer nvcc exists but is of another major than torch: the hatch needs a CUDA 13 torch
    with pytest.raises(ToolkitError) as exc:
        choose([fake("13.0.88", "pip")], arch.parse_arch_list("15.0a"), [], "12.9")
    assert exc.value.fix.startswith("use a torch built for CUDA 13")


# --------------------------------------------------------------------------- moved from test_toolkit.py (real files)

def _specs(value):
    return arch.parse_arch_list(value)


def test_choice_prefers_toolkit_that_builds_120f_over_cuda_home_128(tmp_path):
    old = inspect(str(make_toolkit(tmp_path / "cuda-12.8")), ("CUDA_HOME",))
    new = inspect(str(make_toolkit(tmp_path / "cu13", "13.0.88")), ("pip",))
    ch = choose([old, new], None, [(12, 0)], None)
    assert ch.toolkit is new and ch.targets == ((12, "0f"),)
    (rej,) = ch.rejected
    assert rej.toolkit is old and rej.kind is RejectKind.UNUSABLE
    assert "cannot build sm_120f (nvcc >= 12.9)" in rej.reason


def test_choice_keeps_working_cuda_home(tmp_path):
    a = inspect(str(make_toolkit(tmp_path / "cuda-12.9", "12.9.41")), ("CUDA_HOME",))
    b = inspect(str(make_toolkit(tmp_path / "cu13", "13.0.88")), ("pip",))
    assert choose([a, b], None, [(12, 0)], None).toolkit is a


def test_choice_rejects_torch_major_mismatch(tmp_path):
    a = inspect(str(make_toolkit(tmp_path / "cuda-12.9", "12.9.41")), ("CUDA_HOME",))
    b = inspect(str(make_toolkit(tmp_path / "cu13", "13.0.88")), ("pip",))
    ch = choose([a, b], None, [(12, 0)], "13.0")
    assert ch.toolkit is b and "torch is built for CUDA 13.0" in ch.rejected[0].reason


def test_choice_falls_back_to_120a_when_only_128_exists(tmp_path):
    a = inspect(str(make_toolkit(tmp_path / "cuda-12.8")), ("CUDA_HOME",))
    ch = choose([a], None, [(12, 0)], "12.8")
    assert ch.targets == ((12, "0a"),) and "preferred targets sm_120f" in ch.reason


def test_choice_sm121_needs_129_and_error_lists_reasons(tmp_path):
    a = inspect(str(make_toolkit(tmp_path / "cuda-12.8")), ("CUDA_HOME",))
    bad = inspect(str(make_toolkit(tmp_path / "bad", nvcc_script="#!/bin/sh\necho nope\n")), ("PATH",))
    with pytest.raises(ToolkitError) as exc:
        choose([a, bad], None, [(12, 1)], None)
    msg = str(exc.value)
    assert "sm_121a" in msg and "nvcc 12.8 cannot build sm_121a (nvcc >= 12.9)" in msg
    assert "printed no 'release" in msg and "pip install" in msg


def test_choice_uses_arch_list_and_explicit_suffix(tmp_path):
    a = inspect(str(make_toolkit(tmp_path / "cu13", "13.0.88")), ("pip",))
    ch = choose([a], _specs("9.0 12.0a 12.1"), [], None)
    assert ch.targets == ((9, "0a"), (12, "0a"), (12, "1a"))


def test_no_gpu_no_list_accepts_any_working_toolkit(tmp_path):
    a = inspect(str(make_toolkit(tmp_path / "cuda-12.8")), ("CUDA_HOME",))
    ch = choose([a], None, [], None)
    assert ch.toolkit is a and ch.targets == ()


def test_unknown_future_capability_says_to_upgrade(tmp_path):
    a = inspect(str(make_toolkit(tmp_path / "cu13", "13.0.88")), ("pip",))
    with pytest.raises(ToolkitError) as exc:
        choose([a], None, [(13, 0)], None)
    assert "sm_130a (not in flashinfer-sm120's table: upgrade flashinfer-sm120)" in str(exc.value)

def test_later_candidates_are_not_read_unless_asked(tmp_path):
    marker = tmp_path / "ran"
    a = make_toolkit(tmp_path / "cuda-12.9", "12.9.41", version_json=True)
    b = make_toolkit(tmp_path / "cuda-b", nvcc_script=f"#!/bin/sh\n/usr/bin/touch {marker}\n")
    env = {"CUDA_HOME": str(a), "CUDA_PATH": str(b), "PATH": ""}
    ch = choose(discover(env), None, [(12, 0)], None)
    assert ch.toolkit.root == str(a) and not marker.exists()
    assert {r.toolkit.root: r.kind for r in ch.rejected}[str(b)] is RejectKind.NOT_EXAMINED
    ch = choose(list(discover(env)), None, [(12, 0)], None)  # doctor reads them all
    assert marker.exists()
    rej = {r.toolkit.root: r for r in ch.rejected}[str(b)]
    assert rej.kind is RejectKind.NOT_CHOSEN and rej.reason.startswith("not chosen (")


def test_fix_line_follows_torch_cuda(tmp_path):
    a = inspect(str(make_toolkit(tmp_path / "cuda-12.8")), ("CUDA_HOME",))
    with pytest.raises(ToolkitError) as exc:
        choose([a], None, [(12, 1)], "13.0")
    assert "cuda-toolkit[nvcc,cccl,curand]==13.0.*" in str(exc.value)
    with pytest.raises(ToolkitError) as exc:
        choose([a], None, [(12, 1)], None)
    assert "cuda-toolkit[nvcc,cccl,curand]>=13.0,<14" in str(exc.value)


# --------------------------------------------------------------------------- invariants over every combination

def test_policy_invariants_over_all_toolkit_subsets():
    """Chosen iff some toolkit of an allowed major builds the fallback targets;
    the preferred targets whenever any allowed toolkit builds them; never a
    pip 12.x fix, never an installed clean pip toolkit as the fix."""
    import itertools
    from packaging.specifiers import SpecifierSet

    pool = [fake("12.9.41", "CUDA_HOME"), fake("13.0.88", "pip"),
            fake("13.5.1", "pip", root="/other/site-packages/nvidia/cu13", problem="nvcc 13.5 with CUDA headers 13.0"),
            fake("12.8.93", "/usr/local/cuda"), fake("12.6.85", "PATH")]
    caps_sets = [[(8, 9)], [(9, 0)], [(10, 0)], [(11, 0)], [(12, 0)], [(12, 1)], [(12, 0), (8, 9)]]
    checked = 0
    for r in range(len(pool) + 1):
        for subset in itertools.combinations(pool, r):
            for torch_cuda in (None, "12.6", "12.8", "12.9", "13.0", "13.2"):
                tmaj = Version(torch_cuda).major if torch_cuda else None
                for caps in caps_sets:
                    for min_nvcc in (None, Version("12.8")):
                        pref = [arch.candidate_targets(*c)[0] for c in caps]
                        fb = [arch.candidate_targets(*c)[-1] for c in caps]

                        def ok(tk, targets):
                            v = tk.nvcc_version
                            return (tk.problem is None and (tmaj is None or v.major == tmaj)
                                    and (min_nvcc is None or v >= min_nvcc)
                                    and all(arch.target_supported(t, v) for t in targets))
                        can_pref = [tk for tk in subset if ok(tk, pref)]
                        can_fb = [tk for tk in subset if ok(tk, fb)]
                        try:
                            ch = choose(list(subset), None, caps, torch_cuda, min_nvcc=min_nvcc)
                        except ToolkitError as exc:
                            assert not can_fb, (subset, torch_cuda, caps, min_nvcc)
                            assert "cuda-toolkit[nvcc,cccl,curand]==12" not in exc.fix
                            assert str(exc).endswith("Fix: " + exc.fix)
                            if exc.fix.startswith("pip install 'cuda-toolkit"):
                                spec = SpecifierSet(exc.fix.split("]", 1)[1].rstrip("'"))
                                assert not any("pip" in tk.sources and tk.problem is None
                                               and spec.contains(f"{tk.nvcc_version}.0") for tk in subset)
                        else:
                            assert can_fb and ch.toolkit in can_fb
                            want = pref if can_pref else fb
                            assert set(ch.targets) == set(want), (subset, torch_cuda, caps)
                            if can_pref:
                                assert ch.toolkit in can_pref
                            if tmaj is not None:
                                assert ch.toolkit.nvcc_version.major == tmaj
                        checked += 1
    assert checked == 2 ** len(pool) * 6 * len(caps_sets) * 2


def test_consistent_set_fix_is_pip_only_for_pip_13():
    assert fixes.consistent_set_fix(Version("13.0"), pip=True) == \
        "pip install 'cuda-toolkit[nvcc,cccl,curand]==13.0.*'"
    sys128 = fixes.consistent_set_fix(Version("12.8"), pip=False)
    assert "cuda-toolkit[" not in sys128 and "conda install -c nvidia cuda-toolkit=12.8" in sys128
    assert "cuda-toolkit[" not in fixes.consistent_set_fix(Version("12.9"), pip=True)
