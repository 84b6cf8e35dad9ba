// The user's conversations, most recently active first.
import { conversations, moreConversations, newConversation } from "../app";
import { when } from "../format";
import { useStore } from "../store";

export function Sidebar({ current }: { current?: string }) {
  const { list, next, error } = useStore(conversations);
  return (
    <aside class="sidebar" aria-label="Conversations">
      <button class="primary new" onClick={() => void newConversation()}>
        New conversation
      </button>
      {error && <p class="error">{error}</p>}
      <ul>
        {list.map((conversation) => (
          <li key={conversation.id}>
            <a
              href={`#/c/${conversation.id}`}
              aria-current={conversation.id === current ? "page" : undefined}
              title={conversation.title || "New conversation"}
            >
              <span class="title">{conversation.title || "New conversation"}</span>
              <span class="when">{when(conversation.updated_at)}</span>
            </a>
          </li>
        ))}
      </ul>
      {next && (
        <button class="link" onClick={() => void moreConversations()}>
          More
        </button>
      )}
    </aside>
  );
}
