// The page before a conversation is chosen.
import { info, newConversation } from "../app";
import { useStore } from "../store";

export function Home() {
  const server = useStore(info);
  return (
    <section class="home">
      <h1>Ask about your data</h1>
      <p>
        quarry's agent queries PostgreSQL, exports what it needs as Parquet and runs Python (Polars,
        DuckDB) in an isolated sandbox; every step is measured.
      </p>
      {server && !server.model.available && (
        <p class="notebook-note">
          No language model is configured ({server.model.reason}). You can still run SQL and Python
          cells in a conversation's sandbox.
        </p>
      )}
      <button class="primary" onClick={() => void newConversation()}>
        New conversation
      </button>
    </section>
  );
}
