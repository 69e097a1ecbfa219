"""What ``doctor``, ``cache prune`` and ``verify`` look at, as data; ``cli`` renders it."""
