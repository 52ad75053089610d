// The envsdk web page: plays one episode over the server's /ws protocol (the same frames every
// client sends), shows what the model would read, and polls /health and /metrics.
// Plain browser APIs only; no framework and no build step. Server data is only ever written with
// textContent, never as HTML.
"use strict";

(() => {
  const $ = (id) => document.getElementById(id);
  // A server with a token (ServerConfig.token) is opened as /web?token=…; every request the page
  // makes carries it: a bearer header on fetch, the query parameter on the WebSocket (a browser
  // WebSocket cannot set headers).
  const token = new URLSearchParams(location.search).get("token");
  const authHeaders = token ? { Authorization: `Bearer ${token}` } : {};
  const get = (path) => fetch(path, { headers: authHeaders });

  const page = {
    info: null,          // GET /web/api/info
    ws: null,            // the open WebSocket, or null
    waiting: [],         // resolvers of requests sent, in order (one reply per request, in order)
    observation: null,   // the last observation body
    initialBoard: null,  // Sudoku: the board at reset
    initialFilled: null,
    steps: [],           // Sudoku: {message, board, verdict, reason, reward} per step played
    done: false,
    busy: false,
    lastStats: null,     // {steps, t} of the previous /metrics poll, for steps/s
  };

  // ------------------------------------------------------------------ small helpers

  function isBoard(value) {
    return Array.isArray(value) && value.length === 9 &&
      value.every((row) => Array.isArray(row) && row.length === 9);
  }

  function fmt(x) {
    if (typeof x !== "number") return x === null || x === undefined ? "–" : String(x);
    return Number.isInteger(x) ? String(x) : x.toFixed(3);
  }

  function showError(message) {
    const box = $("error");
    box.textContent = message;
    box.hidden = false;
  }

  function clearError() {
    $("error").hidden = true;
    $("error").textContent = "";
  }

  function setBusy(busy) {
    page.busy = busy;
    document.body.dataset.busy = busy ? "1" : "0";
    $("reset-btn").disabled = busy;
    $("step-btn").disabled = busy || page.observation === null || page.done;
  }

  async function postJSON(path, body) {
    const response = await fetch(path, {
      method: "POST",
      headers: { "Content-Type": "application/json", ...authHeaders },
      body: JSON.stringify(body),
    });
    if (!response.ok) throw new Error(`${path}: HTTP ${response.status} ${await response.text()}`);
    return response.json();
  }

  function parseObject(text, what) {
    let value;
    try {
      value = JSON.parse(text.trim() === "" ? "{}" : text);
    } catch (err) {
      throw new Error(`${what} is not valid JSON: ${err.message}`);
    }
    if (value === null || typeof value !== "object" || Array.isArray(value)) {
      throw new Error(`${what} must be a JSON object, like {"key": "value"}`);
    }
    return value;
  }

  // ------------------------------------------------------------------ WebSocket protocol

  function setConnection(text) {
    $("stat-connection").textContent = text;
  }

  function connect() {
    const scheme = location.protocol === "https:" ? "wss:" : "ws:";
    return new Promise((resolve, reject) => {
      const query = token ? `?token=${encodeURIComponent(token)}` : "";
      const ws = new WebSocket(`${scheme}//${location.host}/ws${query}`);
      let opened = false;
      ws.onopen = () => {
        opened = true;
        page.ws = ws;
        setConnection("open");
        resolve(ws);
      };
      ws.onmessage = (event) => {
        let frame;
        try {
          frame = JSON.parse(event.data);
        } catch (err) {
          frame = { type: "error", data: { code: "UNREADABLE_FRAME", message: String(err) } };
        }
        const waiter = page.waiting.shift();
        if (waiter) waiter.resolve(frame);
        else if (frame.type === "error") showError(describeError(frame.data)); // e.g. CAPACITY_REACHED at accept
      };
      ws.onclose = (event) => {
        if (page.ws === ws) page.ws = null;
        const why = `connection closed (code ${event.code}${event.reason ? ": " + event.reason : ""})`;
        setConnection(`closed (${event.code})`);
        for (const waiter of page.waiting.splice(0)) waiter.reject(new Error(why));
        if (!opened) reject(new Error(`cannot open ${ws.url}: ${why}`));
      };
    });
  }

  async function request(frame) {
    const ws = page.ws && page.ws.readyState === WebSocket.OPEN ? page.ws : await connect();
    return new Promise((resolve, reject) => {
      page.waiting.push({ resolve, reject });
      ws.send(JSON.stringify(frame));
    });
  }

  function describeError(data) {
    data = data || {};
    let text = `${data.code || "ERROR"}: ${data.message || "(no message)"}`;
    if (Array.isArray(data.errors)) {
      text += "\n" + data.errors.map((e) => `  ${(e.loc || []).join(".")}: ${e.msg}`).join("\n");
    }
    return text;
  }

  // ------------------------------------------------------------------ reset and step

  async function doReset() {
    clearError();
    let data;
    try {
      data = parseObject($("kwargs").value, "keyword arguments");
      const seed = $("seed").value.trim();
      if (seed !== "") {
        if (!/^-?\d+$/.test(seed)) throw new Error(`seed must be an integer, got ${seed}`);
        data.seed = Number(seed);
      }
      const variant = $("variant").value.trim();
      if (variant !== "") data.env_id = variant;
    } catch (err) {
      showError(err.message);
      return;
    }
    setBusy(true);
    try {
      const reply = await request({ type: "reset", data });
      if (reply.type === "error") {
        showError(describeError(reply.data));
        return;
      }
      const obs = reply.data.observation || {};
      page.observation = obs;
      page.done = Boolean(reply.data.done);
      page.steps = [];
      page.initialBoard = isBoard(obs.board) ? obs.board.map((row) => row.slice()) : null;
      page.initialFilled = typeof obs.initial_filled === "number" ? obs.initial_filled : null;
      $("history").replaceChildren();
      addHistory(`reset ${JSON.stringify(data)}`, false);
      await show(reply.data);
    } catch (err) {
      showError(err.message);
    } finally {
      setBusy(false);
    }
  }

  function readAction() {
    const field = page.info && page.info.text_field;
    if (field && !$("action-as-json").checked) {
      return { action: { [field]: $("action-text").value }, message: $("action-text").value };
    }
    const action = parseObject($("action-json").value, "the action");
    const message = field && typeof action[field] === "string" ? action[field] : JSON.stringify(action);
    return { action, message };
  }

  async function doStep() {
    clearError();
    let sent;
    try {
      sent = readAction();
    } catch (err) {
      showError(err.message);
      return;
    }
    setBusy(true);
    try {
      const reply = await request({ type: "step", data: sent.action });
      if (reply.type === "error") {
        showError(describeError(reply.data));
        addHistory(`${sent.message} → ${reply.data && reply.data.code}`, true);
        return;
      }
      const obs = reply.data.observation || {};
      page.observation = obs;
      page.done = Boolean(reply.data.done);
      const last = obs.last_move || {};
      if (isBoard(obs.board)) {
        page.steps.push({
          message: sent.message,
          board: obs.board,
          verdict: last.verdict || null,
          reason: last.reason || null,
          reward: typeof reply.data.reward === "number" ? reply.data.reward : 0,
        });
      }
      const verdict = last.verdict ? ` → ${last.verdict}` : "";
      addHistory(`${sent.message}${verdict}  reward ${fmt(reply.data.reward)}${page.done ? "  (done)" : ""}`,
        last.verdict === "invalid" || last.verdict === "bad_format");
      await show(reply.data);
    } catch (err) {
      showError(err.message);
    } finally {
      setBusy(false);
    }
  }

  function addHistory(text, bad) {
    const item = document.createElement("li");
    item.textContent = text;
    if (bad) item.className = "bad";
    $("history").appendChild(item);
  }

  // ------------------------------------------------------------------ rendering

  async function show(data) {
    const obs = data.observation || {};
    $("reward").textContent = fmt(data.reward);
    $("done").textContent = String(Boolean(data.done));
    $("step-count").textContent = fmt(typeof obs.step === "number" ? obs.step : page.steps.length);
    showVerdict(obs.last_move);
    showParts((data.metadata || {}).reward_components);
    $("obs-json").textContent = JSON.stringify(data, null, 2);
    if (isBoard(obs.board) && page.initialBoard) {
      $("board-block").hidden = false;
      drawBoard(obs.board, obs.last_move);
      await showSudokuAnalysis(obs.board);
    } else {
      $("board-block").hidden = true;
      $("components-block").hidden = true;
      // OpenEnvScheduler's default format_observation: the observation as JSON.
      $("model-view").textContent = JSON.stringify(obs);
    }
  }

  function showParts(parts) {
    // Any environment's rubric parts (metadata.reward_components): name -> score, null = not evaluated.
    const block = $("parts-block");
    block.hidden = !parts || typeof parts !== "object";
    if (block.hidden) return;
    const body = document.createElement("tbody");
    for (const [name, value] of Object.entries(parts)) {
      const row = document.createElement("tr");
      row.dataset.part = name;
      const label = document.createElement("td");
      label.textContent = name;
      const cell = document.createElement("td");
      cell.textContent = value === null ? "not evaluated" : fmt(value);
      row.append(label, cell);
      body.appendChild(row);
    }
    $("parts").replaceChildren(body);
  }

  function showVerdict(lastMove) {
    const box = $("verdict");
    box.className = "";
    if (!lastMove || !lastMove.verdict) {
      box.textContent = "–";
      return;
    }
    const move = Array.isArray(lastMove.move) ? ` [${lastMove.move.join(" ")}]` : "";
    box.textContent = `${lastMove.verdict}${move}${lastMove.reason ? " — " + lastMove.reason : ""}`;
    box.className = `verdict-${lastMove.verdict}`;
  }

  function drawBoard(board, lastMove) {
    const body = document.createElement("tbody");
    const last = lastMove && Array.isArray(lastMove.move) ? lastMove.move : null;
    for (let r = 0; r < 9; r++) {
      const row = document.createElement("tr");
      if (r === 2 || r === 5) row.className = "box-bottom";
      for (let c = 0; c < 9; c++) {
        const cell = document.createElement("td");
        const value = board[r][c];
        cell.dataset.row = String(r + 1);
        cell.dataset.col = String(c + 1);
        cell.textContent = value ? String(value) : "";
        const classes = [];
        if (page.initialBoard[r][c]) classes.push("given");
        else if (value) classes.push("placed");
        if (c === 2 || c === 5) classes.push("box-right");
        if (last && last[0] === r + 1 && last[1] === c + 1) {
          classes.push(lastMove.verdict === "valid" ? "last" : "rejected");
        }
        cell.className = classes.join(" ");
        row.appendChild(cell);
      }
      body.appendChild(row);
    }
    $("board").replaceChildren(body);
  }

  async function showSudokuAnalysis(board) {
    // Server-side: the scheduler's own reward and hint code (envsdk.web.sudoku).
    try {
      const scored = await postJSON("/web/api/sudoku/reward", {
        initial_board: page.initialBoard,
        initial_filled: page.initialFilled,
        steps: page.steps,
      });
      const hints = await postJSON("/web/api/sudoku/hints", { board, tried: scored.tried });
      $("model-view").textContent = scored.model_view;
      $("hints").textContent = hints.text || "(no hints)";
      const chips = hints.guaranteed.map((move) => {
        const chip = document.createElement("button");
        chip.type = "button";
        chip.textContent = `[${move.join(" ")}]`;
        chip.title = "use this move";
        chip.addEventListener("click", () => {
          $("action-text").value = chip.textContent;
          $("action-text").focus();
        });
        return chip;
      });
      $("guaranteed").replaceChildren(...chips);
      showComponents(scored);
    } catch (err) {
      showError(`Sudoku analysis failed: ${err.message}`);
    }
  }

  function showComponents(scored) {
    $("components-block").hidden = false;
    const order = ["empty_cell", "valid_move", "repetition", "progress", "correct", "format_penalty", "total_reward"];
    const body = document.createElement("tbody");
    for (const name of order) {
      if (!(name in scored.components)) continue;
      const row = document.createElement("tr");
      row.dataset.component = name;
      if (name === "total_reward") row.className = "total";
      const label = document.createElement("td");
      label.textContent = name;
      const value = document.createElement("td");
      value.textContent = fmt(scored.components[name]);
      row.append(label, value);
      body.appendChild(row);
    }
    $("components").replaceChildren(body);
    const note = $("components-note");
    note.hidden = !scored.note;
    note.textContent = scored.note || "";
  }

  // ------------------------------------------------------------------ live server figures

  function metricSum(text, name) {
    let total = null;
    for (const line of text.split("\n")) {
      if (line.startsWith("#")) continue;
      if (line.startsWith(name + " ") || line.startsWith(name + "{")) {
        const value = Number(line.slice(line.lastIndexOf(" ") + 1));
        if (!Number.isNaN(value)) total = (total || 0) + value;
      }
    }
    return total;
  }

  async function pollStats() {
    try {
      const [health, metrics] = await Promise.all([
        get("/health").then((r) => r.json()),
        get("/metrics").then((r) => (r.ok ? r.text() : "")),
      ]);
      $("stat-active").textContent = fmt(health.active_sessions);
      $("stat-max").textContent = fmt(health.max_sessions);
      const steps = metricSum(metrics, "envsdk_steps_total");
      const errors = metricSum(metrics, "envsdk_errors_total");
      $("stat-steps").textContent = fmt(steps);
      $("stat-errors").textContent = errors === null ? "0" : fmt(errors);
      const now = performance.now();
      if (steps !== null && page.lastStats) {
        const seconds = (now - page.lastStats.t) / 1000;
        $("stat-steps-rate").textContent = seconds > 0 ? ((steps - page.lastStats.steps) / seconds).toFixed(1) : "–";
      }
      if (steps !== null) page.lastStats = { steps, t: now };
    } catch (err) {
      $("stat-active").textContent = "?";
    }
  }

  // ------------------------------------------------------------------ start

  async function start() {
    const infoReply = await get("/web/api/info");
    if (!infoReply.ok) throw new Error(`/web/api/info: HTTP ${infoReply.status} ${await infoReply.text()}`);
    page.info = await infoReply.json();
    document.title = `envsdk · ${page.info.name}`;
    $("env-name").textContent = page.info.name;
    const field = page.info.text_field;
    if (field) {
      $("action-field-name").textContent = field;
      $("action-json").value = JSON.stringify({ [field]: "" });
    } else {
      $("action-as-json").checked = true;
      $("action-as-json").parentElement.hidden = true;
    }
    const syncActionInputs = () => {
      const asJSON = $("action-as-json").checked;
      $("action-json-label").hidden = !asJSON;
      $("action-text-row").hidden = asJSON;
    };
    $("action-as-json").addEventListener("change", syncActionInputs);
    syncActionInputs();
    const params = page.info.reset_parameters;
    $("variant-label").hidden = Array.isArray(params) && !params.includes("env_id");
    $("reset-btn").addEventListener("click", doReset);
    $("step-btn").addEventListener("click", doStep);
    $("action-text").addEventListener("keydown", (event) => {
      if (event.key === "Enter" && !$("step-btn").disabled) doStep();
    });
    setBusy(false);
    pollStats();
    setInterval(pollStats, 2000);
    document.body.dataset.ready = "1";
  }

  start().catch((err) => showError(`cannot load the page: ${err.message}`));
})();
