// ClarifyDelphi's page: one session at a time, kept by the server under its id.
"use strict";
(function () {
  const CLASSES = ["bad", "ok", "good"];
  const $ = (id) => document.getElementById(id);
  let session = null;

  function showError(message) {
    const box = $("error");
    box.textContent = message;
    box.hidden = !message;
  }

  function busy(on) {
    document.body.dataset.busy = on ? "1" : "";
    for (const b of document.querySelectorAll("button")) b.disabled = on;
  }

  async function call(method, path, body) {
    const options = { method: method, headers: {} };
    if (body !== undefined) {
      options.headers["Content-Type"] = "application/json";
      options.body = JSON.stringify(body);
    }
    let response;
    try {
      response = await fetch(path, options);
    } catch (e) {
      throw new Error("the server cannot be reached (" + e.message + ")");
    }
    let data = null;
    try { data = await response.json(); } catch (e) { data = null; }
    if (!response.ok) {
      const why = data && data.error && data.error.message ? data.error.message : response.statusText;
      throw new Error("Error " + response.status + ": " + why);
    }
    return data;
  }

  function el(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function bars(probabilities) {
    const box = el("div", "bars");
    CLASSES.forEach((name, i) => {
      const p = probabilities[i];
      const row = el("div", "bar bar-" + name);
      row.dataset.p = String(p);
      row.appendChild(el("span", "label", name));
      const track = el("div", "track");
      const fill = el("div", "fill");
      fill.style.width = (100 * p).toFixed(1) + "%";
      track.appendChild(fill);
      row.appendChild(track);
      row.appendChild(el("span", "value", p.toFixed(3)));
      box.appendChild(row);
    });
    return box;
  }

  function render() {
    const turns = $("turns");
    turns.textContent = "";
    if (!session) return;
    session.turns.forEach((turn, k) => {
      const card = el("article", "turn");
      card.dataset.turn = String(k);
      card.appendChild(el("h2", "", k === 0 ? "Situation" : "After answer " + k));
      const s = el("p", "situation", turn.situation);
      if (k > 0 && !turn.fused) s.appendChild(el("span", "unchanged", " (unchanged)"));
      card.appendChild(s);
      card.appendChild(bars(turn.probabilities));
      card.appendChild(el("p", "judgment", "Judgment: " + turn.judgment));
      if (turn.question) card.appendChild(el("p", "question", turn.question));
      if (turn.answer) card.appendChild(el("p", "answer", turn.answer));
      else if (turn.skipped) card.appendChild(el("p", "answer", "(skipped)"));
      turns.appendChild(card);
    });
    $("answer-form").hidden = session.done;
    $("start-form").hidden = true;
    $("restart").hidden = !session.done;
    const summary = $("summary");
    summary.hidden = !session.done;
    if (session.done) {
      summary.textContent = "Judgment: " + session.turns.map((t) => t.judgment).join(" \u2192 ");
    }
    document.body.dataset.turns = String(session.turns.length);
    document.body.dataset.session = session.id;
  }

  async function run(action) {
    showError("");
    busy(true);
    try {
      session = await action();
      render();
      if (!session.done) $("answer").focus();
    } catch (e) {
      showError(e.message);
    } finally {
      busy(false);
    }
  }

  $("start-form").addEventListener("submit", (event) => {
    event.preventDefault();
    run(() => call("POST", "/api/sessions", { situation: $("situation").value }));
  });
  $("answer-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const answer = $("answer").value;
    run(async () => {
      const next = await call("POST", "/api/sessions/" + session.id + "/answer", { answer: answer });
      $("answer").value = "";
      return next;
    });
  });
  $("skip").addEventListener("click", () => run(() => call("POST", "/api/sessions/" + session.id + "/skip", {})));
  $("another").addEventListener("click", () => run(() => call("POST", "/api/sessions/" + session.id + "/another", {})));
  $("restart").addEventListener("click", () => {
    session = null;
    render();
    showError("");
    $("start-form").hidden = false;
    $("answer-form").hidden = true;
    $("restart").hidden = true;
    $("summary").hidden = true;
    $("situation").value = "";
    document.body.dataset.turns = "0";
  });
})();
