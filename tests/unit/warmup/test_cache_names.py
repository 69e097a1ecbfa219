"""What `cache export` writes, `cache import` accepts: names as long as FlashInfer makes them, and a
directory export that fails leaves nothing behind (threat-model P4, P5, P7)."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest

from flashinfer_sm120.errors import FormatError
from flashinfer_sm120.safety import formats
from flashinfer_sm120.warmup import cacheexport, cacheinstall, cachemeta

# FlashInfer 0.7.4's FA2 prefill module (185 characters) and one of its objects (227), as `build` makes them.
PREFILL = ("batch_prefill_with_kv_cache_dtype_q_bf16_dtype_kv_bf16_dtype_o_bf16_dtype_idx_i32_head_dim_qk_128_"
           "head_dim_vo_128_posenc_0_use_swa_False_use_logits_cap_False_f16qk_False_kv_stride_equal")
OBJECT = PREFILL + "_batch_prefill_ragged_kernel_mask_0.cuda.o"


def test_a_module_name_as_long_as_flashinfers_is_a_member_and_a_meta_json_name():
    """A new user's export of the README's main job was refused by its own import: the attention
    modules' object files (227 characters) were over a 200-character name rule."""
    assert len(OBJECT) > 200
    rel = f"jit/{PREFILL}/{OBJECT}"
    assert cachemeta.member_rel(f"{cachemeta.TOP}/{rel}", "x.tar") == rel
    meta = cachemeta.parse_meta({"format": cachemeta.FORMAT, "manifest": [], "fingerprint": {
        "flashinfer": "0.7.4", "targets": ["12.0f"], "cuda_version": "13.0", "cuda_home": "/c", "jit_dir": "/j"},
                                 "modules": [{"name": PREFILL, "files": {rel: "0" * 64}}]}, "meta.json")
    assert meta.modules[0].name == PREFILL


def test_a_name_longer_than_linux_takes_is_refused():
    with pytest.raises(FormatError):
        formats.parse_relpath("a" * 256, "member")
    assert formats.parse_relpath("a" * 255, "member") == ("a" * 255,)


def test_a_directory_export_that_fails_leaves_nothing_behind(tmp_path):
    """A failed directory export left a partial directory that also blocked the retry ("already
    exists")."""
    good = tmp_path / "good.so"
    good.write_bytes(b"x" * 100)
    out = tmp_path / "export"
    files = [("jit/m/good.so", good), ("jit/m/gone.so", tmp_path / "gone.so")]  # the second cannot be read
    with pytest.raises(FileNotFoundError):
        cacheexport._write_directory(str(out), b"{}", files, cacheinstall.Budget(cachemeta.Limits()))
    assert sorted(os.listdir(tmp_path)) == ["good.so"]


def test_a_directory_export_is_put_in_place_whole(tmp_path):
    good = tmp_path / "good.so"
    good.write_bytes(b"x" * 100)
    out = tmp_path / "export"
    out.mkdir()  # an empty directory of yours is taken
    blob = json.dumps({"format": 1}).encode()
    cacheexport._write_directory(str(out), blob, [("jit/m/good.so", good)], cacheinstall.Budget(cachemeta.Limits()))
    top = out / cachemeta.TOP
    assert (top / "jit" / "m" / "good.so").read_bytes() == b"x" * 100 and (top / "meta.json").read_bytes() == blob
    assert sorted(os.listdir(tmp_path)) == ["export", "good.so"]
