// Rooms in the dashboard: tabs with attention badges, the message stream with type
// filters and date dividers, NEEDS YOU (approvals, questions, blockers answerable in
// place) and the roster. Live through the same Server-Sent Events as approvals.

const el = (tag, attrs = {}, ...children) => {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") node.className = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
};

const failed = (status, err) => {
  status.className = "notice error";
  status.textContent = err && err.message ? err.message : String(err);
};

const TYPES = ["note", "question", "progress", "done", "blocker", "approval", "answer", "resolution"];
const STATE_LABEL = { waiting: "waiting", blocked: "blocked", done: "done", working: "working", idle: "idle" };

export function createRooms({ api, me, openRequest }) {
  const state = { active: false, rooms: [], room: null, filter: new Set(), showTrash: false, older: { room: null, messages: [], before: null } };
  // The newest messages of a room are shown (newest at the bottom); older pages are
  // loaded on demand and kept while the room stays selected.
  const PAGE = 200;
  // The same breakpoint as app.css's phone layout.
  const narrow = window.matchMedia("(max-width: 899px)");
  narrow.addEventListener("change", () => render());

  const dayLabel = (iso) => {
    const d = new Date(iso);
    const today = new Date();
    const yesterday = new Date(Date.now() - 86400000);
    const same = (a, b) => a.toDateString() === b.toDateString();
    if (same(d, today)) return "Today";
    if (same(d, yesterday)) return "Yesterday";
    return d.toLocaleDateString(undefined, { dateStyle: "full" });
  };
  const time = (iso) => new Date(iso).toLocaleTimeString(undefined, { timeStyle: "short" });

  async function loadRooms() {
    const data = await api("/ui/api/rooms");
    state.rooms = data.rooms;
    renderTabs();
    return data.rooms;
  }

  function renderTabs() {
    const tabs = document.getElementById("room-tabs");
    const visible = state.rooms.filter((r) => state.showTrash || !r.deleted_at);
    tabs.replaceChildren(
      ...visible.map((r) => {
        const a = r.attention || { approvals: 0, questions: 0, blockers: 0 };
        const amber = a.approvals + a.questions;
        return el(
          "button",
          {
            type: "button",
            class: "room-tab",
            "data-room": r.name,
            "aria-current": state.active && state.room === r.name ? "page" : null,
            onclick: () => select(r.name),
          },
          el("span", {}, r.deleted_at ? `${r.title} (trash)` : r.title),
          el("span", { class: "badges" },
            amber ? el("span", { class: "badge", title: "approvals and questions waiting" }, amber) : null,
            a.blockers ? el("span", { class: "badge red", title: "blockers waiting" }, a.blockers) : null),
        );
      }),
    );
    // On a phone the tabs scroll sideways: keep the open room's tab in sight.
    const current = tabs.querySelector('[aria-current="page"]');
    if (current && narrow.matches) current.scrollIntoView({ block: "nearest", inline: "nearest" });
  }

  async function select(name) {
    state.room = name;
    history.replaceState(null, "", `/?room=${encodeURIComponent(name)}`);
    if (!state.active) document.querySelector('nav.side button[data-view="rooms"]').click();
    else render();
  }

  // A live update rebuilds the room; what a person was typing (a reply to a blocker, a
  // note) and where the cursor was must survive it.
  function keepDrafts() {
    const fields = [...document.querySelectorAll("#items textarea[id], #items input[id], #detail-body textarea[id], #detail-body input[id]")]
      .filter((f) => f.value !== f.defaultValue);
    const values = new Map(fields.map((f) => [f.id, f.value]));
    const active = document.activeElement && document.activeElement.id ? document.activeElement : null;
    const focus = active ? { id: active.id, start: active.selectionStart, end: active.selectionEnd } : null;
    return () => {
      for (const [id, value] of values) {
        const f = document.getElementById(id);
        if (f) f.value = value;
      }
      if (focus && document.activeElement !== document.getElementById(focus.id)) {
        const f = document.getElementById(focus.id);
        if (f) {
          f.focus({ preventScroll: true });
          if (typeof focus.start === "number" && "setSelectionRange" in f) {
            try { f.setSelectionRange(focus.start, focus.end); } catch (_) { /* not a text field */ }
          }
        }
      }
    };
  }

  function openSheet(focusId) {
    document.getElementById("detail").classList.add("open");
    const target = focusId && document.getElementById(focusId);
    if (target) target.focus();
    else document.getElementById("sheet-close").focus();
  }

  async function render() {
    if (!state.active) return;
    await loadRooms();
    if (!state.room && state.rooms.length) state.room = state.rooms.find((r) => !r.deleted_at)?.name || state.rooms[0].name;
    renderTabs();
    const items = document.getElementById("items");
    const current = state.rooms.find((r) => r.name === state.room);
    document.getElementById("list-title").textContent = current ? current.title || current.name : state.room || "Rooms";
    if (!state.room) {
      items.replaceChildren(el("p", { class: "empty" }, "No rooms yet. Agents create one when they join or post."), createForm());
      document.getElementById("detail-body").replaceChildren();
      return;
    }
    const [latest, members] = await Promise.all([
      api(`/ui/api/rooms/${encodeURIComponent(state.room)}/messages?latest=true&limit=${PAGE}`),
      api(`/ui/api/rooms/${encodeURIComponent(state.room)}/members`),
    ]);
    if (state.older.room !== state.room) state.older = { room: state.room, messages: [], before: latest.older_before ?? null };
    else if (!state.older.messages.length) state.older.before = latest.older_before ?? null;
    const first = latest.messages.length ? latest.messages[0].seq : Infinity;
    const messages = { ...latest, messages: [...state.older.messages.filter((m) => m.seq < first), ...latest.messages] };
    const side = await sidePanel(messages, members.members);
    const kept = keepDrafts();
    // On a phone the third pane (NEEDS YOU and the roster) is the bottom sheet; a bar at
    // the top of the room says what waits and opens it.
    const waiting = side.waiting;
    const sheetBar = narrow.matches
      ? el("button", { type: "button", class: `btn sheet-open${waiting ? " attention" : ""}`, id: "room-sheet-open", onclick: () => openSheet() },
          waiting ? `Needs you (${waiting}) and roster` : "Roster")
      : null;
    items.replaceChildren(...[sheetBar, filters(), olderButton(), stream(messages.messages), postBox(messages.room), createForm()].filter(Boolean));
    document.getElementById("detail-body").replaceChildren(...side.nodes);
    kept();
  }

  // "Load older": the page before the oldest message shown.
  function olderButton() {
    if (state.older.before === null || state.older.before === undefined) return null;
    const status = el("div", { role: "alert" });
    const load = async () => {
      try {
        const page = await api(`/ui/api/rooms/${encodeURIComponent(state.room)}/messages?before=${state.older.before}&limit=${PAGE}`);
        state.older.messages = [...page.messages, ...state.older.messages];
        state.older.before = page.older_before ?? null;
      } catch (err) {
        failed(status, err);
        return;
      }
      render();
    };
    return el("div", { class: "older" }, el("button", { type: "button", class: "btn small", id: "load-older", onclick: load }, "Load older messages"), status);
  }

  function filters() {
    return el(
      "div",
      { class: "filters chips", role: "group", "aria-label": "Message types" },
      ...TYPES.map((t) =>
        el("button", {
          type: "button",
          class: "chip",
          "aria-pressed": state.filter.has(t) ? "true" : "false",
          onclick: () => {
            if (state.filter.has(t)) state.filter.delete(t);
            else state.filter.add(t);
            render();
          },
        }, t)),
    );
  }

  function stream(messages) {
    const shown = messages.filter((m) => TYPES.includes(m.type) && (state.filter.size === 0 || state.filter.has(m.type)));
    if (!shown.length) return el("p", { class: "empty" }, "No messages yet.");
    const out = [];
    let day = null;
    for (const m of shown) {
      const label = dayLabel(m.at);
      if (label !== day) {
        day = label;
        out.push(el("div", { class: "divider", role: "separator" }, label));
      }
      out.push(
        el("article", { class: `msg ${m.type}`, "data-id": m.id },
          el("div", { class: "meta" },
            el("span", { class: `status ${m.type}` }, m.type),
            el("strong", {}, m.author || ""),
            el("time", { datetime: m.at }, time(m.at)),
            m.open === true ? el("span", { class: "open" }, "open") : null,
            m.open === false ? el("span", { class: "closed" }, m.type === "question" ? "answered" : "resolved") : null,
            m.open === true && narrow.matches
              ? el("button", { type: "button", class: "btn small", onclick: () => openSheet(`reply-${m.id}`) }, m.type === "question" ? "Answer" : "Resolve")
              : null),
          el("div", { class: "text" }, m.text === null ? el("em", {}, "(erased)") : m.text),
        ),
      );
    }
    return el("div", { class: "stream", "aria-live": "polite" }, ...out);
  }

  function postBox(room) {
    if (room.deleted_at) return el("p", { class: "notice info" }, "This room is in the trash.");
    const input = el("textarea", { id: "room-post", rows: "2", maxlength: "8192" });
    const status = el("div", { role: "alert" });
    const send = async () => {
      if (!input.value.trim()) return;
      try {
        await api(`/ui/api/rooms/${encodeURIComponent(state.room)}/messages`, { method: "POST", body: { text: input.value, type: "note" } });
      } catch (err) {
        failed(status, err);
        return;
      }
      input.value = "";
      render();
    };
    return el("form", { class: "decide", onsubmit: (e) => { e.preventDefault(); send(); } },
      el("label", { for: "room-post" }, "Post a note to the room"), input, status,
      el("div", { class: "actions" }, el("button", { class: "btn primary", type: "submit" }, "Post")));
  }

  function createForm() {
    if (me.role !== "admin" && me.role !== "approver") return null;
    const name = el("input", { id: "new-room", placeholder: "room-name", autocomplete: "off" });
    const status = el("div", { role: "alert" });
    return el("form", { class: "decide", onsubmit: async (e) => {
      e.preventDefault();
      const wanted = name.value.trim().toLowerCase();
      try {
        await api("/ui/api/rooms", { method: "POST", body: { name: wanted } });
      } catch (err) {
        failed(status, err);
        return;
      }
      name.value = "";
      select(wanted);
    } },
      el("label", { for: "new-room" }, "New room"), name, status,
      el("div", { class: "actions" }, el("button", { class: "btn", type: "submit" }, "Create room")));
  }

  function answerForm(m, kind) {
    const id = `reply-${m.id}`;
    const input = el("textarea", { id, rows: "2", maxlength: "8192", required: true });
    const status = el("div", { role: "alert" });
    const submit = async () => {
      if (!input.value.trim()) {
        status.className = "notice error";
        status.textContent = "Write a reply first.";
        return;
      }
      const path = kind === "question" ? "questions" : "blockers";
      const body = kind === "question" ? { text: input.value } : { reply: input.value };
      try {
        await api(`/ui/api/rooms/${encodeURIComponent(state.room)}/${path}/${m.id}/${kind === "question" ? "answer" : "resolve"}`, { method: "POST", body });
        render();
      } catch (err) {
        failed(status, err);
      }
    };
    return el("form", { class: `decide needs ${kind}`, "data-id": m.id, onsubmit: (e) => { e.preventDefault(); submit(); } },
      el("div", { class: "meta" }, el("span", { class: `status ${kind}` }, kind), el("strong", {}, m.author || ""), el("time", { datetime: m.at }, time(m.at))),
      el("p", { class: "text" }, m.text),
      el("label", { for: id }, kind === "question" ? "Your answer" : "Your reply (resolves the blocker)"), input, status,
      el("div", { class: "actions" }, el("button", { class: kind === "question" ? "btn primary" : "btn approve", type: "submit" }, kind === "question" ? "Answer" : "Resolve")));
  }

  function renameForm(room, act) {
    const title = el("input", { id: "room-title", value: room.title || room.name, maxlength: "200", autocomplete: "off" });
    return el("form", { class: "decide", onsubmit: (e) => { e.preventDefault(); act("rename", { title: title.value })(); } },
      el("label", { for: "room-title" }, "Room title"), title,
      el("div", { class: "actions" }, el("button", { class: "btn small", type: "submit" }, "Rename")));
  }

  async function sidePanel(messages, members) {
    const open = messages.messages.filter((m) => m.open === true);
    const approvals = messages.messages.filter((m) => m.type === "approval" && m.ref);
    const pending = [];
    for (const a of approvals) {
      try {
        const r = await api(`/ui/api/requests/${encodeURIComponent(a.ref)}`);
        if (r.status === "pending") pending.push(r);
      } catch (_) { /* not visible or gone */ }
    }
    const needs = [
      ...pending.map((r) => el("div", { class: "decide needs approval" },
        el("div", { class: "meta" }, el("span", { class: "status pending" }, "approval"), el("strong", {}, r.requested_by)),
        el("p", { class: "text" }, r.action_description),
        el("div", { class: "actions" }, el("button", { class: "btn primary", type: "button", onclick: () => openRequest(r.request_id) }, "Review and decide")))),
      ...open.filter((m) => m.type === "blocker").map((m) => answerForm(m, "blocker")),
      ...open.filter((m) => m.type === "question").map((m) => answerForm(m, "question")),
    ];
    const roster = el("ul", { class: "roster" },
      ...members.map((p) => el("li", { class: `member ${p.status}` },
        el("span", { class: `status ${p.status}` }, STATE_LABEL[p.status] || p.status),
        el("strong", {}, p.display_name),
        el("time", { datetime: p.last_activity }, `active ${time(p.last_activity)}`),
        p.note ? el("span", { class: "note" }, p.note) : null)));
    const room = messages.room;
    const admin = me.role === "admin" || me.role === "approver";
    const actStatus = el("div", { role: "alert" });
    const act = (action, body = {}) => async () => {
      if (action === "purge" && !confirm(`Purge room ${room.name}? A backup is written first; message texts are then erased.`)) return;
      try {
        await api(`/ui/api/rooms/${encodeURIComponent(room.name)}/${action}`, { method: "POST", body });
      } catch (err) {
        failed(actStatus, err);
        return;
      }
      render();
    };
    return { waiting: needs.length, nodes: [
      el("h2", {}, "Needs you"),
      needs.length ? el("div", {}, ...needs) : el("p", { class: "empty" }, "Nothing in this room waits for you."),
      el("h2", {}, "Roster"),
      members.length ? roster : el("p", { class: "empty" }, "Nobody has joined yet."),
      admin ? el("div", { class: "proof-tools" },
        room.deleted_at
          ? [el("button", { class: "btn small", type: "button", onclick: act("restore") }, "Restore room"),
             el("button", { class: "btn small reject", type: "button", onclick: act("purge") }, "Purge room")]
          : el("button", { class: "btn small", type: "button", onclick: act("delete") }, "Move room to trash"),
        el("button", { class: "btn small", type: "button", onclick: () => { state.showTrash = !state.showTrash; renderTabs(); } }, state.showTrash ? "Hide trash" : "Show trash")) : null,
      admin && !room.deleted_at ? renameForm(room, act) : null,
      admin ? actStatus : null,
    ].filter(Boolean) };
  }

  return {
    async init() {
      const params = new URLSearchParams(location.search);
      await loadRooms().catch(() => {});
      if (params.get("room")) {
        state.room = params.get("room");
        return true;
      }
      return false;
    },
    async show() {
      state.active = true;
      document.getElementById("detail").classList.remove("open");
      await render();
    },
    hide() {
      state.active = false;
      renderTabs();
    },
    async onChange(change) {
      if (change.subject && change.subject.startsWith("room:")) {
        if (state.active && change.subject === `room:${state.room}`) await render();
        else await loadRooms();
      } else if (change.type === "request_decided" || change.type === "request_created") {
        if (state.active) await render();
        else await loadRooms();
      }
    },
  };
}
