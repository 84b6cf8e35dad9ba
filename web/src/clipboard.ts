// Copying text for the user. navigator.clipboard exists only in a secure context (https, or
// http on localhost); a server reached over plain http at a LAN address has none, so there the
// text is put in a hidden textarea, selected and copied with execCommand, which browsers still
// allow in the click that asks for it. (Libraries such as copy-to-clipboard wrap the same one
// call, with fallbacks for old Internet Explorer and a window.prompt we would not want.)

// Copies `text`; false when the browser would not.
export async function copyText(text: string): Promise<boolean> {
  if (!window.isSecureContext || !navigator.clipboard) return copyBySelection(text);
  try {
    await navigator.clipboard.writeText(text);
    return true;
  } catch {
    return copyBySelection(text);
  }
}

function copyBySelection(text: string): boolean {
  const focused = document.activeElement instanceof HTMLElement ? document.activeElement : null;
  const buffer = document.createElement("textarea");
  buffer.value = text;
  buffer.readOnly = true;
  buffer.className = "copy-buffer";
  buffer.setAttribute("aria-hidden", "true");
  buffer.tabIndex = -1;
  document.body.append(buffer);
  buffer.select();
  buffer.setSelectionRange(0, text.length);
  let copied = false;
  try {
    copied = document.execCommand("copy");
  } catch {
    copied = false;
  }
  buffer.remove();
  focused?.focus();
  return copied;
}
