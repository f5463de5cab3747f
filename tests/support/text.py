"""Error rates (words, characters) for the speech tests."""

from __future__ import annotations


def edit_distance(reference: list[str], hypothesis: list[str]) -> int:
    """Levenshtein distance between two sequences of words or characters (substitutions,
    insertions, deletions)."""
    row = list(range(len(hypothesis) + 1))
    for i, ref in enumerate(reference, 1):
        previous, row[0] = row[0], i
        for j, hyp in enumerate(hypothesis, 1):
            previous, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, previous + (ref != hyp))
    return row[-1]
