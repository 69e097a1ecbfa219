"""What ``doctor`` and ``verify`` look at, as data; ``cli`` renders it."""
