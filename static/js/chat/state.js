// What the chat page knows: the session, the open conversation and which branches it shows.

export const state = {
  compareRate: 0,        // share of questions answered side by side while an experiment runs
  conversations: [],
  conv: null,            // {id, title, messages: Map, children: Map, comparisons: Map}
  selected: new Map(),   // parentKey -> chosen child id (which sibling is shown)
  busy: false,
  abort: null,
  stick: true,           // keep the newest text in view while it streams (false once the user scrolls up)
  renaming: null,        // id of the conversation whose title is being edited
};
