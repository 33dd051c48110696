import { h } from "../ui.js";
export async function render(root) { root.append(h("h1", null, "models")); }
