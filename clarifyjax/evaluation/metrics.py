"""The numbers of `clarifyjax evaluate`, from what its stages saved (arrays and texts in, numbers out;
no model here): `table4` (the paper's Table 4: JSD and judgment flips), `table4_samples` (the
per-situation values its means average) and `update_generation` (Table 3's BLEU-4 and ROUGE-L)."""
from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np

from clarifyjax.reward import jsd

FLIP_READINGS = ("base", "pair")


def table4(p_base, p_weak, p_strong, valid, answered) -> dict[str, float]:
    """p_base, p_weak, p_strong [n, 3]; valid [n] bool (the pair was fused and judged);
    answered [n, 2] bool (that answer was kept and fused). Rates in [0, 1], NaN when empty.

    The average JSD between the weakener's and the strengthener's distributions (valid pairs), and
    judgment flips read two ways: ``base`` (an updated situation changes the judge's argmax from
    the base's; share of the answers kept) and ``pair`` (the two argmax classes differ; share of
    the valid pairs)."""
    p_base, p_weak, p_strong = (np.asarray(p, np.float64) for p in (p_base, p_weak, p_strong))
    valid = np.asarray(valid, bool)
    answered = np.asarray(answered, bool) & valid[:, None]
    if not len(valid):
        return {"avg_jsd": float("nan"), "flips_base": float("nan"),
                "flips_pair": float("nan"), "pairs": 0, "answers": 0}
    p_updated = np.stack([p_weak, p_strong], axis=1)
    pair_flips = p_weak.argmax(-1) != p_strong.argmax(-1)
    return {
        "avg_jsd": float(jsd.average_jsd(p_weak, p_strong, valid)),
        "flips_base": float(jsd.flip_rate(p_base, p_updated, answered)),
        "flips_pair": float(pair_flips[valid].mean()) if valid.any() else float("nan"),
        "pairs": int(valid.sum()), "answers": int(answered.sum())}


def table4_samples(p_base, p_weak, p_strong, valid, answered) -> dict[str, np.ndarray]:
    """What `table4`'s means average, for standard errors and paired gains: jsd [n]
    (JSD_2(p_weak, p_strong); avg_jsd is its mean over the valid pairs), raw [n] (the JSD where
    valid, else 0: the PPO reward's raw units, defined on every situation), valid [n], and each
    reading's flip indicators (flips_base over the answers kept and fused, flips_pair over the
    valid pairs: the flip rates are their means)."""
    valid = np.asarray(valid, bool)
    if not len(valid):
        empty = np.zeros(0)
        return {"jsd": empty, "raw": empty, "valid": valid, "flips_base": empty,
                "flips_pair": empty}
    p_base, p_weak, p_strong = (np.asarray(p, np.float64) for p in (p_base, p_weak, p_strong))
    answered = np.asarray(answered, bool) & valid[:, None]
    div = np.asarray(jsd.jsd(p_weak, p_strong, axis=-1), np.float64)
    updated = np.stack([p_weak.argmax(-1), p_strong.argmax(-1)], axis=1)
    return {"jsd": div, "raw": np.where(valid, div, 0.0), "valid": valid,
            "flips_base": (updated != p_base.argmax(-1)[:, None])[answered].astype(np.float64),
            "flips_pair": (updated[:, 0] != updated[:, 1])[valid].astype(np.float64)}


def update_generation(hypotheses: Sequence[str], references: Sequence[Sequence[str]]
                      ) -> dict[str, float]:
    """BLEU-4 and ROUGE-L (x 100) of generated updates against their groups' references: nltk
    ``corpus_bleu`` on whitespace tokens against every reference of the group, rouge-score
    ``rougeL`` F1 with the Porter stemmer against the best reference, averaged."""
    from nltk.translate.bleu_score import corpus_bleu
    from rouge_score import rouge_scorer

    if len(hypotheses) != len(references) or not hypotheses:
        raise ValueError(f"update_generation: {len(hypotheses)} hypotheses for "
                         f"{len(references)} reference groups")
    with warnings.catch_warnings():  # nltk warns when a higher-order n-gram never matches
        warnings.simplefilter("ignore")
        bleu = corpus_bleu([[r.split() for r in refs] for refs in references],
                           [h.split() for h in hypotheses])
    scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)
    rouge = [scorer.score_multi(list(refs), h)["rougeL"].fmeasure
             for h, refs in zip(hypotheses, references)]
    return {"bleu4": 100.0 * float(bleu), "rouge_l": 100.0 * float(np.mean(rouge)),
            "hypotheses": len(hypotheses)}


def percent(flags) -> float:
    """100 x the share of True entries (NaN when empty)."""
    flags = np.asarray(flags, bool)
    return 100.0 * float(flags.mean()) if flags.size else float("nan")
