// The Sudoku server's panel on envsdk's web page: the board, the hints and the reward
// components. Loaded by the page (WebPanel.script); the numbers come from the scheduler's own
// code through POST /web/api/sudoku/hints and /web/api/sudoku/reward, never from JS.
// Server data is only ever written with textContent, never as HTML.
"use strict";

(() => {
  window.envsdkPanels = window.envsdkPanels || {};
  window.envsdkPanels.sudoku = (page) => {
    const { $, postJSON, fmt, setAction } = page;
    const state = { initialBoard: null, initialFilled: null, steps: [] };

    function element(tag, attrs, ...children) {
      const node = document.createElement(tag);
      Object.assign(node, attrs || {});
      node.append(...children);
      return node;
    }

    // The panel's parts, placed in the page's panel slots.
    const board = element("table", { id: "board", className: "board" });
    const guaranteed = element("div", { id: "guaranteed", className: "chips" });
    const hints = element("pre", { id: "hints" });
    const boardBlock = element("div", { id: "board-block", hidden: true },
      board, element("div", { id: "hints-block" }, element("h3", {}, "Hints"), guaranteed, hints));
    const components = element("table", { id: "components" });
    const note = element("p", { id: "components-note", className: "note", hidden: true });
    const small = element("small", {}, "(SudokuScheduler)");
    const componentsBlock = element("div", { id: "components-block", hidden: true },
      element("h3", {}, "Reward components ", small), components, note);
    $("panel-obs").replaceChildren(boardBlock);
    $("panel-result").replaceChildren(componentsBlock);

    function isBoard(value) {
      return Array.isArray(value) && value.length === 9 &&
        value.every((row) => Array.isArray(row) && row.length === 9);
    }

    function drawBoard(cells, lastMove) {
      const body = document.createElement("tbody");
      const last = lastMove && Array.isArray(lastMove.move) ? lastMove.move : null;
      for (let r = 0; r < 9; r++) {
        const row = document.createElement("tr");
        if (r === 2 || r === 5) row.className = "box-bottom";
        for (let c = 0; c < 9; c++) {
          const cell = document.createElement("td");
          const value = cells[r][c];
          cell.dataset.row = String(r + 1);
          cell.dataset.col = String(c + 1);
          cell.textContent = value ? String(value) : "";
          const classes = [];
          if (state.initialBoard[r][c]) classes.push("given");
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
      board.replaceChildren(body);
    }

    function showComponents(scored) {
      componentsBlock.hidden = false;
      const order = ["empty_cell", "valid_move", "repetition", "progress", "correct", "format_penalty", "total_reward"];
      const body = document.createElement("tbody");
      for (const name of order) {
        if (!(name in scored.components)) continue;
        const row = document.createElement("tr");
        row.dataset.component = name;
        if (name === "total_reward") row.className = "total";
        row.append(element("td", {}, name), element("td", {}, fmt(scored.components[name])));
        body.appendChild(row);
      }
      components.replaceChildren(body);
      note.hidden = !scored.note;
      note.textContent = scored.note || "";
    }

    return {
      onReset(obs) {
        state.steps = [];
        state.initialBoard = isBoard(obs.board) ? obs.board.map((row) => row.slice()) : null;
        state.initialFilled = typeof obs.initial_filled === "number" ? obs.initial_filled : null;
      },
      onStep(message, data) {
        const obs = data.observation || {};
        const last = obs.last_move || {};
        if (!isBoard(obs.board)) return;
        state.steps.push({
          message,
          board: obs.board,
          verdict: last.verdict || null,
          reason: last.reason || null,
          reward: typeof data.reward === "number" ? data.reward : 0,
        });
      },
      async show(data) {
        const obs = data.observation || {};
        if (!isBoard(obs.board) || !state.initialBoard) {
          boardBlock.hidden = true;
          componentsBlock.hidden = true;
          return false;
        }
        boardBlock.hidden = false;
        drawBoard(obs.board, obs.last_move);
        const scored = await postJSON("/web/api/sudoku/reward", {
          initial_board: state.initialBoard,
          initial_filled: state.initialFilled,
          steps: state.steps,
        });
        const hinted = await postJSON("/web/api/sudoku/hints", { board: obs.board, tried: scored.rejected });
        $("model-view").textContent = scored.model_view;
        hints.textContent = hinted.text || "(no hints)";
        guaranteed.replaceChildren(...hinted.guaranteed.map((move) => {
          const chip = element("button", { type: "button", title: "use this move" }, `[${move.join(" ")}]`);
          chip.addEventListener("click", () => setAction(chip.textContent));
          return chip;
        }));
        showComponents(scored);
        return true;
      },
    };
  };
})();
