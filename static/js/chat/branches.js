// The visible path through a conversation's branches (regenerated answers, edited questions).

import { state } from "./state.js";

function defaultChild(parentKey, ids) {
  const pair = state.conv.comparisons.get(parentKey);
  if (pair && pair.winner) return pair.winner === "b" ? pair.b : pair.a;
  return ids[ids.length - 1];
}

function chosenChild(parentKey) {
  const ids = state.conv.children.get(parentKey) || [];
  if (!ids.length) return null;
  const chosen = state.selected.get(parentKey);
  return ids.includes(chosen) ? chosen : defaultChild(parentKey, ids);
}

export function visiblePath() {
  const path = [];
  if (!state.conv) return path;
  let key = "root";
  for (;;) {
    const id = chosenChild(key);
    if (id == null) break;
    path.push(state.conv.messages.get(id));
    key = id;
  }
  return path;
}

export function lastAnswerId() {
  const path = visiblePath();
  for (let i = path.length - 1; i >= 0; i--) if (path[i].role === "assistant") return path[i].id;
  return null;
}

export function siblingsOf(m) {
  return state.conv.children.get(m.parent_id ?? "root") || [m.id];
}
