"""Former name of :mod:`flashinfer_sm120.view` (kept so existing imports work)."""

from __future__ import annotations

from .view import CudaHome, CudaHomeError, ViewError, cache_root, find_curand_include, linkable_home

__all__ = ["CudaHome", "CudaHomeError", "ViewError", "cache_root", "find_curand_include", "linkable_home"]
