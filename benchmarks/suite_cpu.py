"""Where the suite's CPU time goes: sum what ``pytest --cpu-profile FILE`` recorded, by file and by test.

    pytest -n 2 --dist loadfile --cpu-profile /tmp/cpu.jsonl; python benchmarks/suite_cpu.py /tmp/cpu.jsonl

Each test's figure is its process's CPU and its children's (fork-server children included), taken around the
test; session fixtures count in the first test that uses them.  The total is within a few per cent of what
``/usr/bin/time`` reports for the whole run.
"""

from __future__ import annotations

import argparse
import collections
import json


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("profile", help="the JSON-lines file written by pytest --cpu-profile")
    ap.add_argument("--top", type=int, default=25, help="how many tests and files to list (default 25)")
    args = ap.parse_args()
    tests: dict[str, float] = collections.Counter()
    with open(args.profile, encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            tests[row["test"]] += row["cpu_s"]
    files: dict[str, float] = collections.Counter()
    for name, cpu in tests.items():
        files[name.partition("::")[0]] += cpu
    total = sum(tests.values())
    print(f"{len(tests)} tests, {total / 60:.1f} CPU-min")
    for title, rows in (("files", files), ("tests", tests)):
        print(f"\n{title} by CPU seconds:")
        for name, cpu in sorted(rows.items(), key=lambda kv: -kv[1])[:args.top]:
            print(f"{cpu:8.1f}  {100 * cpu / total:5.1f} %  {name}")


if __name__ == "__main__":
    main()
