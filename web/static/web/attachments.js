// Attachments (files.md, session files): chosen files are uploaded as session files and
// sent as `input_image` / `input_file` blocks next to the text.
import { api } from "./api.js";

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
