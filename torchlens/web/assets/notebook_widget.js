/* torchlens: the front end of a watch's live explorer in Jupyter (an anywidget module; its
 * kernel side is torchlens/train/backends/notebook.py). Each view is the explorer page in a sandboxed
 * iframe (isolated from the notebook's CSS, JS and ids, as the static snapshot is); the kernel
 * pushes new steps through the widget's comm, and this module relays them into the page
 * (live.js applies them). No network: the page and every update travel over the comm. */

const logs = new WeakMap();  // model -> every update received, replayed to views that open late

function logOf(model) {
  let log = logs.get(model);
  if (!log) {
    log = [];
    logs.set(model, log);
  }
  return log;
}

function initialize({ model }) {
  const log = logOf(model);
  const keep = (message) => { if (message && message.type === "update") log.push(message.update); };
  model.on("msg:custom", keep);
  return () => model.off("msg:custom", keep);
}

function render({ model, el }) {
  const frame = document.createElement("iframe");
  frame.setAttribute("sandbox", "allow-scripts");
  frame.setAttribute("data-role", "torchlens-live");
  frame.style.cssText = `width: 100%; height: ${model.get("height")}px; border: 1px solid #ddd; border-radius: 4px;`;
  frame.srcdoc = model.get("page");
  el.appendChild(frame);
  let ready = false;
  const post = (update) => frame.contentWindow.postMessage({ torchlens: "update", update }, "*");
  const onPage = (event) => {
    if (event.source !== frame.contentWindow || !event.data || event.data.torchlens !== "ready") return;
    ready = true;
    for (const update of logOf(model)) post(update);
    // what was pushed before this front end listened (a reload, a late start) is asked for
    model.send({ type: "sync", since: event.data.last });
  };
  const onKernel = (message) => {
    if (ready && message && message.type === "update") post(message.update);
    if (message && message.type === "error") frame.contentWindow.postMessage({ torchlens: "error", message: message.message }, "*");
  };
  window.addEventListener("message", onPage);
  model.on("msg:custom", onKernel);
  return () => {
    window.removeEventListener("message", onPage);
    model.off("msg:custom", onKernel);
  };
}

export default { initialize, render };
