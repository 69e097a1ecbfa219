"""Find every CUDA toolkit (:mod:`.sources`), read what its nvcc says (:mod:`.probe`) and choose the first
that builds the wanted targets (:mod:`.policy`, fix lines in :mod:`.fixes`); :mod:`.ninja` finds ninja."""
