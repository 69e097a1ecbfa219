"""What the tests share: fake toolkits, GPUs and servers, other users, cgroups, the fork server (conftest.py holds the fixtures)."""
