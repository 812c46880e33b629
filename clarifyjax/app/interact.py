"""`clarifyjax interact MODELS.yaml`: ClarifyDelphi in the terminal (or through a pipe).

You type a situation; the judge gives its judgment with P(bad, ok, good); the system asks its
question; you answer it (an empty line or /skip skips it, /another asks another question, /quit
ends the session); the answer is fused into the situation and the judge judges the updated
situation. After three turns (`clarify.MAX_TURNS`) a summary shows how the judgment moved, and
the next situation may follow. Every turn is saved in the transcript (JSONL, rewritten whole after
each turn), one line per turn: the session, the turn, the situation, its probabilities and
judgment, the question asked, and the answer.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from clarifyjax.app.options import add_models_options, load_clarifier, load_models
from clarifyjax.core.commands import subcommand

COMMANDS = {"/skip": "skip", "": "skip", "/another": "another", "/quit": "quit"}


def _interact_options(p: argparse.ArgumentParser) -> None:
    add_models_options(p)
    p.add_argument("--transcript", type=Path, default=Path("transcript.jsonl"),
                   help="JSONL, one line per turn (default: transcript.jsonl)")


def _read(prompt: str, interactive: bool) -> str | None:
    """One line of input (None at the end of the input)."""
    if interactive:
        try:
            return input(prompt)
        except EOFError:
            return None
    line = sys.stdin.readline()
    return None if not line else line.rstrip("\r\n")


def _show(turn, number: int) -> None:
    from clarifyjax.app.clarifier import CLASSES

    bars = "  ".join(f"{c} {p:.3f} {'#' * round(20 * p):<20}" for c, p in
                     zip(CLASSES, turn.probabilities))
    title = "situation" if number == 0 else f"updated situation (turn {number})"
    if number and not turn.fused:
        title += " [unchanged]"
    print(f"{title}: {turn.situation}\njudgment: {turn.to_dict()['judgment']}   {bars}",
          flush=True)
    if turn.question:
        print(f"question: {turn.question}", flush=True)


def transcript_lines(sessions) -> list[str]:
    lines = []
    for session in sessions:
        for k, turn in enumerate(session.turns):
            lines.append(json.dumps({"session": session.id, "turn": k, **turn.to_dict()},
                                    ensure_ascii=False, allow_nan=False))
    return lines


@subcommand("interact", "ClarifyDelphi in the terminal: a situation, its judgment, a question, "
            "your answer, the updated judgment (three turns); the transcript is saved as JSONL",
            _interact_options)
def run_interact(args: argparse.Namespace) -> int:
    from clarifyjax.core.commands import CLIError
    from clarifyjax.files.textfiles import atomic_write_bytes, check_output

    cfg = load_models(args)
    check_output(args.transcript, overwrite=True, option="--transcript", error=CLIError)
    import jax

    from clarifyjax.app.clarifier import Session, SessionError, run_steps

    interactive = sys.stdin.isatty()
    clarifier = load_clarifier(args, cfg)
    key, steps, sessions = jax.random.key(args.seed), 0, []

    def step(session) -> None:
        nonlocal steps
        run_steps(clarifier, [session], jax.random.fold_in(key, steps))
        steps += 1
        atomic_write_bytes(args.transcript,
                           ("\n".join(transcript_lines(sessions)) + "\n").encode("utf-8"))

    print("Type a situation (an empty line or the end of the input stops). Answer each question, "
          "or /skip, /another, /quit.", flush=True)
    while True:
        text = _read("situation> ", interactive)
        if text is None or not text.strip():
            break
        try:
            session = Session.start(text)
        except SessionError as e:
            print(f"error: {e}", flush=True)
            continue
        sessions.append(session)
        step(session)
        _show(session.turns[0], 0)
        reply = ""
        while not session.done:
            reply = _read("answer> ", interactive)
            if reply is None:
                break
            action = COMMANDS.get(reply.strip(), "answer")
            if action == "quit":
                break
            if action == "answer":
                session.answer(reply)
            elif action == "skip":
                session.skip()
            else:
                session.another_question()
            step(session)
            if action == "another":
                print(f"question: {session.turns[-1].question}", flush=True)
            else:
                _show(session.turns[-1], len(session.turns) - 1)
        print(f"summary: {session.summary()}", flush=True)
        if reply is None:
            break
    if sessions:
        print(f"transcript: {args.transcript} ({sum(len(s.turns) for s in sessions)} turns)")
    return 0
