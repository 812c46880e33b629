"""The exact input format of every ClarifyDelphi model, as pure string functions (the table of
formats is above `policy_input`), so that the policy, the answer generator, the fusion model, the
judge and the NLI filter see at inference exactly what they saw in training.

Functions take and return `str` (or tuples of them); a missing or empty field raises
`TextFormatError` naming the field (and the row, when the caller passes `where=`)."""
from __future__ import annotations

import re
from collections.abc import Mapping

POLICY_PREFIX = "question: "
ANSWER_PREFIX = "answer: "
FUSION_PREFIX = "merge: "
JUDGE_PREFIX = "[moral_single]: "
WH_SEPARATOR = " Q.: "
DISCRIMINATOR_LABELS = ("irrelevant", "relevant")  # label 0, 1

WEAKENER = "weakener"
STRENGTHENER = "strengthener"
UPDATE_TYPES = (WEAKENER, STRENGTHENER)

# Delphi's target: "<class>1</class> <text>it's good</text>". The judge teacher-forces the class
# prefix and reads the next token's logits over the class tokens.
DELPHI_CLASS_PREFIX = "<class>"
DELPHI_CLASS_TOKENS = ("1", "0", "-1")  # good, ok, bad: Delphi's label strings
JUDGE_CLASSES = ("bad", "ok", "good")  # column order of every judge distribution [batch, 3]
LABEL_TO_CLASS = {-1: "bad", 0: "ok", 1: "good"}
CLASS_TO_LABEL = {v: k for k, v in LABEL_TO_CLASS.items()}
DEFAULT_JUDGMENT_TEXT = {-1: "it's bad", 0: "it's okay", 1: "it's good"}

# Question starts seen in δ-CLARIFY train.tsv (first word, lower-cased), the wh-baseline's prompts.
WH_WORDS = ("what", "how", "why", "who", "where", "when", "which", "whose", "whom")

_WHITESPACE = re.compile(r"\s+")
# Delphi decodes "<" as <unk> (T5's vocabulary lacks it), and a tokenizer that drops <unk> on
# decoding leaves "class>1/class> text>..": accept all three spellings.
_DELPHI_OUTPUT = re.compile(
    r"(?:<unk>|<)?\s*class>\s*(-?\d+)\s*(?:<unk>|<)?\s*/\s*class>\s*"
    r"(?:(?:<unk>|<)?\s*text>\s*(.*?)\s*(?:(?:<unk>|<)?\s*/\s*text>|$))?", re.DOTALL)


class TextFormatError(ValueError):
    """A field that cannot be formatted; the message names the field (and the row if known)."""


def _field(value, name: str, where: str | None, *, allow_empty: bool = False) -> str:
    """Type-check and whitespace-normalize one field."""
    loc = f"{where}: " if where else ""
    if not isinstance(value, str):
        raise TextFormatError(f"{loc}field {name!r} must be a string, got {type(value).__name__}")
    value = normalize_whitespace(value)
    if not value and not allow_empty:
        raise TextFormatError(f"{loc}field {name!r} is empty")
    return value


# --------------------------------------------------------------------------- normalization


def normalize_whitespace(text: str) -> str:
    """Collapse every run of whitespace (tabs, newlines) to one space and strip the ends."""
    return _WHITESPACE.sub(" ", text).strip()


def ensure_period(text: str) -> str:
    """`text` ending in exactly one final "." (added when missing), as the original did.

    Only a missing period is added: "?" or "!" endings get a "." too, because the original
    checked for "." alone and the fusion/silver training situations all end in ".".
    """
    text = text.rstrip()
    if not text:
        return text
    return text if text.endswith(".") else text + "."


# transformers' `PreTrainedTokenizerBase.clean_up_tokenization` (the same ten rules in 4.9.1, which
# the original ran, and today), in its order: what `batch_decode(clean_up_tokenization_spaces=True)`
# does to a decoded text.
_CLEAN_UP = ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
             (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"))


def clean_up_tokenization(text: str) -> str:
    """`text` as transformers' ``clean_up_tokenization_spaces=True`` leaves it: the space before
    . ? ! , and before the contractions n't 'm 's 've 're removed, " ' " made "'"."""
    for old, new in _CLEAN_UP:
        text = text.replace(old, new)
    return text


def strip_policy_prefix(text: str) -> str:
    """Remove a leading "question: " (the policy's prefix) and surrounding whitespace.

    Only a prefix is removed; the word "question:" inside the text is kept (the original's
    `re.sub('question: ', '', s)` also deleted it mid-sentence).
    """
    text = normalize_whitespace(text)
    while text.startswith(POLICY_PREFIX.strip()):
        rest = text[len(POLICY_PREFIX.strip()):]
        if rest and not rest[0].isspace():
            break  # "question:x" is not the prefix
        text = rest.strip()
    return text


def _situation(value, where: str | None) -> str:
    return strip_policy_prefix(_field(value, "situation", where))


# --------------------------------------------------------------------------- question generation


# The input format of every ClarifyDelphi model (docs/originals.md), one place for every prompt
# string, so that each model sees at inference exactly what it saw in training:
#     policy            "question: " + situation                                      -> question
#     wh-conditioned    "{situation} Q.: {wh-word}"                                   -> question
#     answer generator  "answer: " + judgment + " " + situation. + " TYPE: " + type
#                       + " QUESTION: " + question                                    -> answer
#       (SFT, silver)   "answer: {Hypothesis} TYPE: {UpdateType} QUESTION: {question_davinci}" -> Update
#     fusion            "merge: SITUATION: " + situation. + " QUESTION: " + q + " ANSWER: " + a
#                                                                                     -> updated situation
#     judge (Delphi)    "[moral_single]: " + text  -> "<class>{1|0|-1}</class> <text>{judgment}</text>"
#     NLI               premise = situation (+ "." with period=True), hypothesis = answer
#     discriminator     the pair (situation, question), an encoder classifier's two segments
#                       -> class 1 "relevant" | 0 "irrelevant"
# The original passed the policy's query ("question: " + situation) straight into the judge and the
# fusion model; here every consumer of a situation strips that prefix (`strip_policy_prefix`).
def policy_input(situation: str, *, where: str | None = None) -> str:
    """The question generator's (the PPO policy's) input: "question: " + situation.

    Idempotent: a situation that already carries the prefix gets it once.
    """
    situation = _situation(situation, where)
    if not situation:
        raise TextFormatError(f"{where + ': ' if where else ''}field 'situation' is empty")
    return POLICY_PREFIX + situation


def question_sft_example(situation: str, question: str, *, where: str | None = None
                         ) -> tuple[str, str]:
    """(source, target) for SFT of the question generator on train.tsv / dev.tsv rows."""
    return policy_input(situation, where=where), _field(question, "question", where)


def wh_word(question: str, *, where: str | None = None) -> str:
    """The first word of `question`, lower-cased, without punctuation ("Why is..." -> "why")."""
    question = _field(question, "question", where)
    word = re.sub(r"[^\w']+$", "", question.split(" ", 1)[0]).lower()
    if not word:
        raise TextFormatError(f"{where + ': ' if where else ''}field 'question' has no first word")
    return word


def wh_question_input(situation: str, wh: str, *, where: str | None = None) -> str:
    """The wh-conditioned generator's input (the pipeline baseline): "{situation} Q.: {wh-word}"."""
    situation = _situation(situation, where)
    wh = _field(wh, "wh_word", where)
    return situation + WH_SEPARATOR + wh


def wh_question_sft_example(situation: str, question: str, *, where: str | None = None
                            ) -> tuple[str, str]:
    """(source, target): the source conditioned on the question's own first word."""
    question = _field(question, "question", where)
    return wh_question_input(situation, wh_word(question, where=where), where=where), question


# --------------------------------------------------------------------------- answer generation


def _update_type(value, where: str | None) -> str:
    value = _field(value, "update_type", where).lower()
    if value not in UPDATE_TYPES:
        raise TextFormatError(f"{where + ': ' if where else ''}field 'update_type' must be one of "
                              f"{UPDATE_TYPES}, got {value!r}")
    return value


def answer_input(situation: str, question: str, update_type: str, judgment: str = "", *,
                 where: str | None = None) -> str:
    """The answer generator's input, as the original built it during PPO.

    "answer: " + judgment + " " + situation + " TYPE: " + update_type + " QUESTION: " + question,
    with the situation stripped of the policy prefix and ending in ".". An empty judgment (a judge
    without judgment text) leaves out the judgment and its space.
    """
    situation = ensure_period(_situation(situation, where))
    if not situation:
        raise TextFormatError(f"{where + ': ' if where else ''}field 'situation' is empty")
    judgment = _field(judgment, "judgment", where, allow_empty=True)
    head = f"{judgment} {situation}" if judgment else situation
    return (f"{ANSWER_PREFIX}{head} TYPE: {_update_type(update_type, where)} "
            f"QUESTION: {_field(question, 'question', where)}")


def answer_sft_example(hypothesis: str, update_type: str, question: str, update: str, *,
                       where: str | None = None) -> tuple[str, str]:
    """(source, target) from a silver row: "answer: {Hypothesis} TYPE: {UpdateType} QUESTION:
    {question_davinci}" -> Update. The hypothesis plays the part of "judgment + situation"."""
    source = (f"{ANSWER_PREFIX}{_field(hypothesis, 'Hypothesis', where)} "
              f"TYPE: {_update_type(update_type, where)} "
              f"QUESTION: {_field(question, 'question_davinci', where)}")
    return source, _field(update, "Update", where)


def answer_input_without_question(hypothesis: str, update_type: str, *,
                                  where: str | None = None) -> str:
    """Table 3's update generator without the intermediate question: "answer: {Hypothesis} TYPE:
    {UpdateType}" (`answer_sft_example`'s source with its QUESTION part left out)."""
    return (f"{ANSWER_PREFIX}{_field(hypothesis, 'Hypothesis', where)} "
            f"TYPE: {_update_type(update_type, where)}")


def answer_sft_from_row(row: Mapping[str, str], *, where: str | None = None) -> tuple[str, str]:
    """`answer_sft_example` over a row of sc_dev_questions_gpt.tsv (columns by name)."""
    cols = ("Hypothesis", "UpdateType", "question_davinci", "Update")
    _require_columns(row, cols, where)
    return answer_sft_example(*(row[c] for c in cols), where=where)


# --------------------------------------------------------------------------- fusion


# Where the original's inference differed from its training data (no "." added to the fusion
# model's situation, a "." added to the NLI premise), a `period` argument picks the rule
# (`config.PipelineConfig` fusion_situation_period, nli_premise_period; docs/fidelity.md).
def fusion_fields(situation: str, question: str, answer: str, *, period: bool = True,
                  where: str | None = None) -> str:
    """"SITUATION: s. QUESTION: q ANSWER: a": the fields of fusion_dev.csv's `input` column.

    The situation loses the policy prefix and, with `period`, ends in "." (every fusion_dev.csv
    situation does; the original's PPO reward passed the situation as it was, `period=False`).
    The answer may be empty (a filtered answer fused anyway, the original's `blank` policy).
    """
    situation = _situation(situation, where)
    situation = ensure_period(situation) if period else situation
    if not situation:
        raise TextFormatError(f"{where + ': ' if where else ''}field 'situation' is empty")
    return (f"SITUATION: {situation} QUESTION: {_field(question, 'question', where)} "
            f"ANSWER: {_field(answer, 'answer', where, allow_empty=True)}").rstrip()


def fusion_input(situation: str, question: str, answer: str, *, period: bool = True,
                 where: str | None = None) -> str:
    """The fusion model's input: "merge: SITUATION: s. QUESTION: q ANSWER: a" (`period`: as
    `fusion_fields`)."""
    return FUSION_PREFIX + fusion_fields(situation, question, answer, period=period, where=where)


_FUSION_ROW = re.compile(r"^SITUATION: .+ QUESTION: .* ANSWER:")


def fusion_sft_example(input_text: str, output_text: str, *, where: str | None = None
                       ) -> tuple[str, str]:
    """(source, target) from a fusion_dev.csv row: "merge: " + input -> output."""
    input_text = _field(input_text, "input", where)
    if not _FUSION_ROW.match(input_text):
        raise TextFormatError(f"{where + ': ' if where else ''}field 'input' is not "
                              f"'SITUATION: ... QUESTION: ... ANSWER: ...': {input_text[:80]!r}")
    return FUSION_PREFIX + input_text, _field(output_text, "output", where)


def fusion_sft_from_row(row: Mapping[str, str], *, where: str | None = None) -> tuple[str, str]:
    _require_columns(row, ("input", "output"), where)
    return fusion_sft_example(row["input"], row["output"], where=where)


# --------------------------------------------------------------------------- judge (Delphi)


def judge_input(text: str, *, prefix: str = JUDGE_PREFIX, allow_empty: bool = False,
                where: str | None = None) -> str:
    """The judge's input: "[moral_single]: " + text (the policy prefix stripped, unlike the
    original). `prefix`: another judge's (a classifier judge reads the text alone, prefix "").
    A text that is empty without the policy prefix raises `TextFormatError`, unless
    `allow_empty` (the original judged an empty fusion output as "[moral_single]: ")."""
    situation = strip_policy_prefix(_field(text, "situation", where, allow_empty=allow_empty))
    if not situation and not allow_empty:
        raise TextFormatError(f"{where + ': ' if where else ''}field 'situation' is empty")
    return prefix + situation


def parse_label(label, *, where: str | None = None) -> int:
    """A judge label as Delphi's integer: 1/0/-1, "1"/"0"/"-1" or "good"/"ok"/"bad"."""
    loc = f"{where}: " if where else ""
    if isinstance(label, str):
        key = label.strip().lower()
        if key in CLASS_TO_LABEL:
            return CLASS_TO_LABEL[key]
        try:
            label = int(key)
        except ValueError:
            raise TextFormatError(f"{loc}field 'label' must be one of 1, 0, -1, good, ok, bad; "
                                  f"got {label!r}") from None
    if isinstance(label, bool) or not isinstance(label, int) or label not in LABEL_TO_CLASS:
        raise TextFormatError(f"{loc}field 'label' must be one of 1, 0, -1, good, ok, bad; "
                              f"got {label!r}")
    return label


def delphi_target(label, judgment: str | None = None, *, where: str | None = None) -> str:
    """Delphi's target "<class>{1|0|-1}</class> <text>{judgment}</text>".

    `judgment` defaults to a generic text for the class ("it's good", "it's okay", "it's bad").
    """
    label = parse_label(label, where=where)
    text = DEFAULT_JUDGMENT_TEXT[label] if judgment is None else _field(judgment, "judgment", where)
    return f"{DELPHI_CLASS_PREFIX}{label}</class> <text>{text}</text>"


def judge_sft_example(text: str, label, judgment: str | None = None, *,
                      where: str | None = None) -> tuple[str, str]:
    """(source, target) for SFT of a judge on any (text, class) pair."""
    return judge_input(text, where=where), delphi_target(label, judgment, where=where)


def parse_delphi_output(decoded: str, *, keep_unparsed: bool = False) -> tuple[int | None, str]:
    """(label, judgment text) from a decoded Delphi output.

    Accepts "<class>1</class> <text>it's good</text>", the `<unk>` spelling that a T5 vocabulary
    without "<" decodes to ("<unk> class>1<unk> /class> <unk> text>...") and the one left when
    <unk> is dropped on decoding ("class>1/class> text>..."). An output without a class gives
    (None, ""), or with `keep_unparsed` (None, the whole output), as the original's split on its
    separators did (the judge's judgment text).
    """
    decoded = decoded.replace("</s>", "").replace("<pad>", "")
    match = _DELPHI_OUTPUT.search(decoded)
    if not match or int(match.group(1)) not in LABEL_TO_CLASS:
        return None, normalize_whitespace(decoded) if keep_unparsed else ""
    return int(match.group(1)), normalize_whitespace(match.group(2) or "")


# --------------------------------------------------------------------------- discriminator


def discriminator_label(label, *, where: str | None = None) -> int:
    """The discriminator's class id of a label field: 1 / "relevant" -> 1, 0 / "irrelevant" -> 0
    (the classifier's id2label order, `DISCRIMINATOR_LABELS`)."""
    value = _field(str(label), "label", where).lower()
    ids = {"1": 1, "0": 0, **{w: i for i, w in enumerate(DISCRIMINATOR_LABELS)}}
    if value not in ids:
        raise TextFormatError(f"{where + ': ' if where else ''}field 'label' must be one of "
                              f"{sorted(ids)}, got {label!r}")
    return ids[value]


# --------------------------------------------------------------------------- NLI


def nli_pair(situation: str, answer: str, *, period: bool = False, where: str | None = None
             ) -> tuple[str, str]:
    """(premise, hypothesis) for the NLI filter: premise = situation (no prefix; with `period`,
    ending in "." as the original's premise did, `ensure_period`), hypothesis = answer."""
    premise = _situation(situation, where)
    return ensure_period(premise) if period else premise, _field(answer, "answer", where)


# --------------------------------------------------------------------------- helpers


def _require_columns(row: Mapping[str, str], columns, where: str | None) -> None:
    missing = [c for c in columns if c not in row or row[c] is None]
    if missing:
        loc = f"{where}: " if where else ""
        raise TextFormatError(f"{loc}missing column(s) {missing}; the row has {sorted(row)}")
