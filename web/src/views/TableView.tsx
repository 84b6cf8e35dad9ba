// A CSV or Parquet artifact as a table: a page at a time from the server, sorted by any column
// (the whole file, not just the page).
import { useEffect, useState } from "preact/hooks";

import { api, type Artifact, type TablePage } from "../api";
import { messageOf } from "../conversation";
import { cell } from "../format";

const kPage = 20;

export function TableView({ artifact }: { artifact: Artifact }) {
  const [offset, setOffset] = useState(0);
  const [sort, setSort] = useState<{ column: string; order: "asc" | "desc" } | null>(null);
  // The page shown and the request it answers: busy until the page answers the current one.
  const [shown, setShown] = useState<{ page: TablePage; request: string } | null>(null);
  const [error, setError] = useState<string | null>(null);
  const [attempt, setAttempt] = useState(0);
  const request = `${offset} ${sort?.column ?? ""} ${sort?.order ?? ""}`;

  useEffect(() => {
    let current = true;
    api
      .table(artifact.id, offset, kPage, sort?.column, sort?.order)
      .then((page) => current && (setShown({ page, request }), setError(null)))
      .catch((failure) => current && setError(messageOf(failure)));
    return () => {
      current = false;
    };
  }, [artifact.id, request, attempt]);

  // A page that failed keeps the table shown (if one was) and can be asked for again.
  const failed = error && (
    <p class="error" role="alert">
      {error}{" "}
      <button
        class="link"
        onClick={() => {
          setError(null);
          setAttempt(attempt + 1);
        }}
      >
        Try again
      </button>
    </p>
  );
  if (!shown) return failed || <p class="loading">Loading table…</p>;
  const { page } = shown;
  const busy = !error && shown.request !== request;
  const sortBy = (column: string) => {
    setOffset(0);
    setSort(sort?.column === column && sort.order === "asc" ? { column, order: "desc" } : { column, order: "asc" });
  };
  const last = Math.min(page.total_rows, page.offset + page.rows.length);
  return (
    <div class="table-view" aria-busy={busy}>
      <div class="table-scroll">
        <table>
          <thead>
            <tr>
              {page.columns.map((column) => (
                <th
                  key={column.name}
                  scope="col"
                  aria-sort={sort?.column === column.name ? (sort.order === "asc" ? "ascending" : "descending") : undefined}
                >
                  <button class="sort" title={column.type} onClick={() => sortBy(column.name)}>
                    {column.name}
                    {sort?.column === column.name ? (sort.order === "asc" ? " ▲" : " ▼") : ""}
                  </button>
                </th>
              ))}
            </tr>
          </thead>
          <tbody>
            {page.rows.map((row, index) => (
              <tr key={page.offset + index}>
                {row.map((value, column) => (
                  <td key={column} class={typeof value === "number" ? "number" : undefined}>
                    {value === null ? <span class="null">null</span> : cell(value)}
                  </td>
                ))}
              </tr>
            ))}
          </tbody>
        </table>
      </div>
      {failed}
      <div class="pager">
        <span>
          {page.total_rows === 0 ? "no rows" : `rows ${page.offset + 1}–${last} of ${page.total_rows}`}
        </span>
        <button class="link" disabled={offset === 0} onClick={() => setOffset(Math.max(0, offset - kPage))}>
          Previous
        </button>
        <button class="link" disabled={last >= page.total_rows} onClick={() => setOffset(offset + kPage)}>
          Next
        </button>
      </div>
    </div>
  );
}
