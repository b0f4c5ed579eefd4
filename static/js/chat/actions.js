// What the controls of the views do. messages.js (a conversation's nodes) and sidebar.js (the
// conversation list) call these; main.js binds them at start-up to functions of feedback.js,
// flags.js, send.js, render.js and conversation.js. Those draw the views again, so a view that
// imported them would close an import cycle (tests/meta/test_static_modules.py forbids one).

export const actions = {};

export function bindActions(handlers) {
  Object.assign(actions, handlers);
}
