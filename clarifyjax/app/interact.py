"""`clarifyjax interact MODELS.yaml`: ClarifyDelphi in the terminal (or through a pipe).

You type a situation, see the judgment, answer the system's question (an empty line or /skip
skips it, /another asks another, /quit ends; a line that is one /word is always a command), and
the judge judges the fused situation, for up to `clarifier.MAX_TURNS` turns. A text that `ask` or
`web` would refuse is one error line and the prompt asks again. Every turn goes to the transcript."""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import jax

from clarifyjax.app.ask import cut_note
from clarifyjax.app.options import add_models_options, load_clarifier, load_models
from clarifyjax.core.commands import subcommand, CLIError
from clarifyjax.app.clarifier import CLASSES, Session, SessionError, run_steps
from clarifyjax.files.textfiles import atomic_write_bytes, check_output

COMMANDS = {"/skip": "skip", "": "skip", "/another": "another", "/quit": "quit"}
_COMMAND = re.compile(r"/[A-Za-z]+")  # a line that is one /word is a command, never a text


def command_of(line: str, prompt: str) -> str | None:
    """The action a line asks for at `prompt` ("situation" or "answer"): "quit", "skip",
    "another", "answer" (an answer's text) or "situation" (a situation's text); None when the
    line is a command that does not apply there (a message says why)."""
    word = line.strip()
    if prompt == "situation":
        if word == "/quit":
            return "quit"
        if word in ("/skip", "/another"):
            print(f"error: {word} acts on a question; type a situation first (or /quit)",
                  flush=True)
            return None
    elif word in COMMANDS:
        return COMMANDS[word]
    if _COMMAND.fullmatch(word):
        print(f"error: unknown command {word}; the commands are /skip, /another and /quit",
              flush=True)
        return None
    return prompt


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
    """The transcript (JSONL, rewritten whole after each turn), one line per turn: the session, the
    turn, the situation, its probabilities and judgment, the question asked and the answer."""
    lines = []
    for session in sessions:
        for k, turn in enumerate(session.turns):
            lines.append(json.dumps({"session": session.id, "turn": k, **turn.to_dict()},
                                    ensure_ascii=False, allow_nan=False))
    return lines


def _converse(session, step, interactive: bool) -> str | None:
    """The answers to one session's questions until it is done; the last reply (None at the
    end of the input, "/quit" when the user quits)."""
    reply = ""
    while not session.done:
        reply = _read("answer> ", interactive)
        if reply is None:
            return None
        action = command_of(reply, "answer")
        if action == "quit":
            return reply
        try:
            if action == "answer":
                session.answer(reply)
            elif action == "skip":
                session.skip()
            elif action == "another":
                session.another_question()
            else:
                continue
        except SessionError as e:
            print(f"error: {e}", flush=True)
            continue
        step(session)
        if action == "another":
            print(f"question: {session.turns[-1].question}", flush=True)
        else:
            _show(session.turns[-1], len(session.turns) - 1)
    return reply


@subcommand("interact", "ClarifyDelphi in the terminal: a situation, its judgment, a question, "
            "your answer, the updated judgment (three turns); the transcript is saved as JSONL",
            _interact_options)
def run_interact(args: argparse.Namespace) -> int:
    cfg = load_models(args)
    check_output(args.transcript, overwrite=True, option="--transcript", error=CLIError)

    interactive = sys.stdin.isatty()
    if hasattr(sys.stdin, "reconfigure"):  # bytes that are not UTF-8: refused below, by line
        sys.stdin.reconfigure(errors="surrogateescape")
    clarifier = load_clarifier(args, cfg)
    key, steps, sessions = jax.random.key(args.seed), 0, []

    def step(session) -> None:
        nonlocal steps
        run_steps(clarifier, [session], jax.random.fold_in(key, steps))
        steps += 1
        atomic_write_bytes(args.transcript,
                           ("\n".join(transcript_lines(sessions)) + "\n").encode("utf-8"))
        if clarifier.cuts:
            print(cut_note(clarifier.cuts, 1), flush=True)

    print("Type a situation (an empty line or the end of the input stops). Answer each question, "
          "or /skip, /another, /quit.", flush=True)
    while True:
        text = _read("situation> ", interactive)
        if text is None or not text.strip():
            break
        action = command_of(text, "situation")
        if action == "quit":
            break
        if action is None:
            continue
        try:
            session = Session.start(text)
        except SessionError as e:
            print(f"error: {e}", flush=True)
            continue
        sessions.append(session)
        step(session)
        _show(session.turns[0], 0)
        reply = _converse(session, step, interactive)
        print(f"summary: {session.summary()}", flush=True)
        if reply is None:
            break
    if sessions:
        print(f"transcript: {args.transcript} ({sum(len(s.turns) for s in sessions)} turns)")
    return 0
