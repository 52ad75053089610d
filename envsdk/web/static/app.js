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
    modelPrevious: null, // the observation the model read before the last one (null after a reset)
    stepCount: 0,        // steps answered with an observation since the reset
    panel: null,         // the env's panel ({onReset, onStep, show}), when it has one
    done: false,
    busy: false,
    lastStats: null,     // {steps, t} of the previous /metrics poll, for steps/s
  };

  // ------------------------------------------------------------------ small helpers

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
      if (variant !== "" && !$("variant-label").hidden) data.env_id = variant;
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
      page.modelPrevious = null;
      page.done = Boolean(reply.data.done);
      page.stepCount = 0;
      if (page.panel && page.panel.onReset) page.panel.onReset(obs);
      $("history").replaceChildren();
      const view = await show(reply.data);
      addHistory(`reset ${JSON.stringify(data)}`, false, view);
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
    if (!field && !$("action-as-json").checked) {
      const action = readForm($("action-form"));
      return { action, message: JSON.stringify(action) };
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
      page.modelPrevious = page.observation;
      page.observation = obs;
      page.done = Boolean(reply.data.done);
      page.stepCount += 1;
      if (page.panel && page.panel.onStep) page.panel.onStep(sent.message, reply.data);
      const last = obs.last_move || {};
      const verdict = last.verdict ? ` → ${last.verdict}` : "";
      const view = await show(reply.data);
      addHistory(`${sent.message}${verdict}  reward ${fmt(reply.data.reward)}${page.done ? "  (done)" : ""}`,
        last.verdict === "invalid" || last.verdict === "bad_format", view);
    } catch (err) {
      showError(err.message);
    } finally {
      setBusy(false);
    }
  }

  // One history line per reset or step, with the observation it brought (as the page shows it).
  function addHistory(text, bad, view) {
    const item = document.createElement("li");
    const head = document.createElement("div");
    head.textContent = text;
    item.appendChild(head);
    const seen = view && (view.text || (view.html ? "(HTML view)" : ""));
    if (seen) {
      const obs = document.createElement("pre");
      obs.className = "history-obs";
      obs.textContent = seen.length > 600 ? seen.slice(0, 600) + " …" : seen;
      item.appendChild(obs);
    }
    if (bad) item.className = "bad";
    $("history").appendChild(item);
  }

  // ------------------------------------------------------------------ rendering

  // Shows a reply: the figures, the observation as the env renders it (POST /web/api/render:
  // its render_web hook, else its text), the legal actions, then the panel's own drawing.
  // Returns the view, for the history.
  async function show(data) {
    const obs = data.observation || {};
    $("reward").textContent = fmt(data.reward);
    $("done").textContent = String(Boolean(data.done));
    $("step-count").textContent = fmt(typeof obs.step === "number" ? obs.step : page.stepCount);
    showVerdict(obs.last_move);
    showParts((data.metadata || {}).reward_components);
    $("obs-json").textContent = JSON.stringify(data, null, 2);
    await showModelView(obs);
    let view = null;
    try {
      view = await postJSON("/web/api/render", { observation: obs });
    } catch (err) {
      showError(`cannot render the observation: ${err.message}`);
    }
    showView(view);
    if (page.panel && page.panel.show) {
      try {
        // A panel that drew the observation itself returns true: the text view would repeat it.
        if (await page.panel.show(data)) $("obs-view").hidden = true;
      } catch (err) {
        showError(`${page.info.panel} panel: ${err.message}`);
      }
    }
    return view;
  }

  // What the model reads, rendered by the server with the schedulers' own function, so the
  // characters are the ones a model gets (a transcript: only what is new since the last one).
  async function showModelView(obs) {
    try {
      const reply = await postJSON("/web/api/model_view", { observation: obs, previous: page.modelPrevious });
      $("model-view").textContent = reply.text;
    } catch (err) {
      $("model-view").textContent = "";
      showError(`cannot render what the model reads: ${err.message}`);
    }
  }

  function showView(view) {
    const frame = $("obs-html");
    const text = $("obs-view");
    frame.hidden = !(view && view.html);
    text.hidden = !(view && !view.html);
    if (view && view.html) frame.srcdoc = view.html; // sandboxed: no scripts, no same origin
    else frame.removeAttribute("srcdoc");
    text.textContent = view && view.text ? view.text : "";
    const chips = (view && view.actions ? view.actions : []).map((action) => {
      const chip = document.createElement("button");
      chip.type = "button";
      chip.textContent = action;
      chip.title = "use this action";
      chip.addEventListener("click", () => setAction(action));
      return chip;
    });
    $("legal-actions").replaceChildren(...chips);
    $("legal-actions-block").hidden = chips.length === 0;
  }

  function setAction(text) {
    if ($("action-as-json").checked && page.info.text_field) {
      $("action-json").value = JSON.stringify({ [page.info.text_field]: text });
    } else if ($("action-as-json").checked) {
      $("action-json").value = text;
    } else {
      $("action-text").value = text;
      $("action-text").focus();
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

  // An env's panel script (WebPanel.script) registers window.envsdkPanels[name] = (api) => panel.
  function loadPanel(name) {
    return new Promise((resolve, reject) => {
      const script = document.createElement("script");
      script.src = `/web/panel/${encodeURIComponent(name)}.js${token ? `?token=${encodeURIComponent(token)}` : ""}`;
      script.onload = () => {
        const make = (window.envsdkPanels || {})[name];
        if (typeof make !== "function") reject(new Error(`panel script ${name} registered nothing`));
        else resolve(make({ $, postJSON, fmt, showError, setAction }));
      };
      script.onerror = () => reject(new Error(`cannot load the ${name} panel script`));
      document.head.appendChild(script);
    });
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

  // ------------------------------------------------------------------ tools (tool envs)

  let rpcId = 0;

  function toolByName(name) {
    return (page.info.tools || []).find((t) => t.name === name);
  }

  // The JSON type of a schema property: its "type", or the first non-null one of an anyOf
  // (pydantic writes `int | None` that way); "string" when it says none.
  function kindOf(prop) {
    if (prop.type) return prop.type;
    const options = Array.isArray(prop.anyOf) ? prop.anyOf.filter((o) => o.type && o.type !== "null") : [];
    return options.length ? options[0].type : "string";
  }

  // One labelled input per property of a JSON object schema (a tool's arguments, an action's
  // fields): numbers, checkboxes, text, and JSON boxes for objects and arrays.
  function buildForm(form, schema, skip) {
    form.replaceChildren();
    const required = new Set(schema.required || []);
    for (const [name, prop] of Object.entries(schema.properties || {})) {
      if (skip && skip.has(name)) continue;
      const kind = kindOf(prop);
      const label = document.createElement("label");
      label.textContent = `${name}${required.has(name) ? "" : " (optional)"} `;
      const input = document.createElement(kind === "object" || kind === "array" ? "textarea" : "input");
      input.dataset.arg = name;
      input.dataset.kind = kind;
      if (kind === "integer" || kind === "number") input.type = "number";
      else if (kind === "boolean") input.type = "checkbox";
      else if (input.tagName === "INPUT") input.type = "text";
      if (prop.description) input.title = prop.description;
      label.appendChild(input);
      form.appendChild(label);
    }
  }

  function readForm(form) {
    const args = {};
    for (const input of form.querySelectorAll("[data-arg]")) {
      const kind = input.dataset.kind;
      if (kind === "boolean") args[input.dataset.arg] = input.checked;
      else if (input.value === "") continue;
      else if (kind === "integer" || kind === "number") args[input.dataset.arg] = Number(input.value);
      else if (kind === "object" || kind === "array") args[input.dataset.arg] = JSON.parse(input.value);
      else args[input.dataset.arg] = input.value;
    }
    return args;
  }

  function showToolForm() {
    const tool = toolByName($("tool-select").value);
    $("tool-form").replaceChildren();
    if (!tool) return;
    $("tool-description").textContent = tool.description || "";
    buildForm($("tool-form"), tool.inputSchema || {});
  }

  // A tool env keeps its reward in its state (`reward`), not in a step's reply: show it after
  // every call.
  async function showStateReward() {
    const reply = await request({ type: "state" });
    const reward = reply.type === "state" && reply.data ? reply.data.reward : undefined;
    if (typeof reward === "number") $("reward").textContent = fmt(reward);
  }

  async function doCallTool() {
    clearError();
    const name = $("tool-select").value;
    let args;
    try {
      args = readForm($("tool-form"));
    } catch (err) {
      showError(`arguments: ${err.message}`);
      return;
    }
    setBusy(true);
    try {
      rpcId += 1;
      const reply = await request({
        type: "mcp", data: { jsonrpc: "2.0", id: rpcId, method: "tools/call", params: { name, arguments: args } },
      });
      if (reply.type === "error") {
        showError(describeError(reply.data));
        return;
      }
      const rpc = reply.data || {};
      const shown = `${name}(${JSON.stringify(args)})`;
      if (rpc.error) {
        $("tool-result").textContent = `error ${rpc.error.code}: ${rpc.error.message}`;
        addHistory(`${shown} → error`, true);
      } else {
        $("tool-result").textContent = JSON.stringify(rpc.result.data, null, 2);
        addHistory(`${shown} → ${JSON.stringify(rpc.result.data)}`, false);
      }
      await showStateReward();
    } catch (err) {
      showError(err.message);
    } finally {
      setBusy(false);
    }
  }

  function setUpTools() {
    const tools = page.info.tools;
    if (!Array.isArray(tools) || tools.length === 0) return;
    const select = $("tool-select");
    for (const tool of tools) {
      const option = document.createElement("option");
      option.value = option.textContent = tool.name;
      select.appendChild(option);
    }
    select.addEventListener("change", showToolForm);
    $("tool-call-btn").addEventListener("click", doCallTool);
    showToolForm();
    $("tools-panel").hidden = false;
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
      $("action-text").placeholder = page.info.action_placeholder || "";
    } else {
      // No single text field: one input per action field, from the action's schema.
      buildForm($("action-form"), page.info.action_schema || {}, new Set(["metadata"]));
    }
    const syncActionInputs = () => {
      const asJSON = $("action-as-json").checked;
      $("action-json-label").hidden = !asJSON;
      $("action-text-row").hidden = asJSON || !field;
      $("action-form").hidden = asJSON || Boolean(field);
    };
    $("action-as-json").addEventListener("change", syncActionInputs);
    syncActionInputs();
    // The variant box only for envs whose reset names an env_id.
    const params = page.info.reset_parameters;
    $("variant-label").hidden = !(Array.isArray(params) && params.includes("env_id"));
    if (page.info.panel) page.panel = await loadPanel(page.info.panel);
    setUpTools();
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
