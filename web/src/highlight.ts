// Code and SQL highlighted with highlight.js, only the languages quarry's steps use.
import hljs from "highlight.js/lib/core";
import python from "highlight.js/lib/languages/python";
import sql from "highlight.js/lib/languages/sql";

hljs.registerLanguage("python", python);
hljs.registerLanguage("sql", sql);

// HTML of `code` with highlighting spans; highlight.js escapes the text.
export function highlight(code: string, language: "python" | "sql"): string {
  return hljs.highlight(code, { language, ignoreIllegals: true }).value;
}

// Highlights the fenced code blocks of rendered Markdown in place.
export function highlightBlocks(root: HTMLElement) {
  for (const block of root.querySelectorAll<HTMLElement>("pre code")) {
    const language = /language-(\w+)/.exec(block.className)?.[1];
    if (language && hljs.getLanguage(language)) hljs.highlightElement(block);
  }
}
