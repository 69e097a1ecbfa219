"""The patch's state: the private directory a listing command's FlashInfer import makes its workspace in."""

import os
import tempfile
import time


def test_a_killed_listings_private_directory_is_swept_by_the_next(tmp_path, monkeypatch):
    """``doctor`` killed (``kill -9``) left its ``flashinfer-sm120-list-*/alone`` in TMPDIR for good: the next listing
    removes one nobody holds that is over a minute old, as every private directory of ours (P3)."""
    from flashinfer_sm120.core.patch.state import State

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    stale, fresh = tmp_path / "flashinfer-sm120-list-dead", tmp_path / "flashinfer-sm120-list-young"
    (stale / "alone").mkdir(parents=True)
    fresh.mkdir()
    old = time.time() - 120
    os.utime(stale, (old, old))
    made = State().listing_dir()
    assert not stale.exists() and fresh.exists() and os.path.isdir(made), os.listdir(tmp_path)
