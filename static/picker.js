// The New-job form's file picker: "use" puts the entry's path into its field (a list field gets one
// more line), then the field's input event asks the server where the path points. No inline script:
// the page's CSP allows only files from this origin.
document.addEventListener("click", (event) => {
  const use = event.target.closest("[data-pick-path]");
  const close = event.target.closest("[data-picker-close]");
  if (close) {
    const box = document.getElementById("picker-" + close.dataset.pickerClose);
    if (box) box.replaceChildren();
    return;
  }
  if (!use) return;
  const form = use.closest("form");
  const field = form && form.elements.namedItem(use.dataset.pickField);
  if (!field) return;
  const path = use.dataset.pickPath;
  if (field.tagName === "TEXTAREA") {
    const lines = field.value.split("\n").map((l) => l.trim()).filter((l) => l);
    if (!lines.includes(path)) lines.push(path);
    field.value = lines.join("\n");
  } else {
    field.value = path;
    const box = document.getElementById("picker-" + use.dataset.pickField);
    if (box) box.replaceChildren();
  }
  field.dispatchEvent(new Event("input", { bubbles: true }));
  field.focus();
});
