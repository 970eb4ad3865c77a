// Attachments (files.md, session files): chosen files are uploaded as session files and
// sent as `input_image` / `input_file` blocks next to the text.
import { api } from "./api.js";
import { el } from "./util.js";

export async function uploadAll(sessionId, files) {
  const blocks = [];
  for (const file of files) {
    const body = new FormData();
    body.append("file", file, file.name);
    const stored = await api(
      "POST",
      `/v1/sessions/${encodeURIComponent(sessionId)}/resources/files`,
      undefined,
      { form: body },
    );
    const type = stored.metadata?.content_type ?? file.type ?? "";
    blocks.push({
      type: type.startsWith("image/") ? "input_image" : "input_file",
      file_id: stored.id,
      filename: stored.name ?? file.name,
    });
  }
  return blocks;
}

// The files chosen for the next message, before it is sent: a chip each with the name,
// the size, a thumbnail for an image (a data: URL, which the page's CSP allows) and a
// Remove button.
export class AttachmentChips {
  constructor(input, list) {
    this.input = input;
    this.list = list;
    this.files = [];
    input.addEventListener("change", () => {
      this.files.push(...input.files);
      input.value = ""; // the same file may be chosen again after a Remove
      this.draw();
    });
  }

  clear() {
    this.files = [];
    this.draw();
  }

  remove(file) {
    this.files = this.files.filter((other) => other !== file);
    this.draw();
    this.input.focus();
  }

  draw() {
    this.list.hidden = !this.files.length;
    this.list.replaceChildren(
      ...this.files.map((file) => {
        const thumb = file.type.startsWith("image/") ? el("img", { class: "thumb", alt: "" }) : null;
        if (thumb) {
          const reader = new FileReader();
          reader.onload = () => thumb.setAttribute("src", String(reader.result));
          reader.readAsDataURL(file);
        }
        return el(
          "li",
          { class: "chip", dataset: { name: file.name } },
          thumb,
          el("span", { class: "chip-name", text: file.name }),
          el("span", { class: "chip-size muted", text: formatSize(file.size) }),
          el("button", {
            type: "button",
            class: "link chip-remove",
            "aria-label": `Remove ${file.name}`,
            text: "×",
            onclick: () => this.remove(file),
          }),
        );
      }),
    );
  }
}

export function formatSize(bytes) {
  if (bytes < 1024) return `${bytes} B`;
  if (bytes < 1024 * 1024) return `${(bytes / 1024).toFixed(1)} KB`;
  return `${(bytes / (1024 * 1024)).toFixed(1)} MB`;
}
