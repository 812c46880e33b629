"""Input files for the sage-jax reliability tests (test_sage_reliability, test_sage_reliability_api):
the release's pairs file, cut to a few questions, and CSV writing."""
from __future__ import annotations

import csv

from helpers.env import shared_data

PAIRS = "sage-mcc/vicuna-7b-v1.5_pairs_0.csv"


def write_csv(path, header, rows, delimiter=",", encoding="utf-8"):
    with open(path, "w", newline="", encoding=encoding) as f:
        w = csv.writer(f, delimiter=delimiter)
        w.writerow(header)
        w.writerows(rows)
    return path


def pairs_file(path, edit=None, questions=3):
    """The first `questions` questions of the release's pairs file; edit(rows) may change them."""
    with open(shared_data(PAIRS), newline="", encoding="utf-8") as f:
        lines = list(csv.reader(f))
    rows = [list(r) for r in lines[1:1 + 10 * questions]]
    if edit:
        edit(rows)
    return write_csv(path, lines[0], rows)
