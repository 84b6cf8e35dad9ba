// How the history stores write a value in a column and read it back, the same in SQLite and in
// PostgreSQL: the words of roles, turn kinds and statuses, JSON as text, a conversation's
// network.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "conversation/history_store.h"

namespace quarry::conversation {

// The inverses of to_string; a word no store writes reads as user, ask and failed.
Role role_from(std::string_view text);
TurnKind turn_kind_from(std::string_view text);
TurnStatus turn_status_from(std::string_view text);

// JSON as a column holds it (invalid UTF-8 replaced, so the text is always valid JSON).
std::string json_text(const nlohmann::json& value);
// Null for text that does not parse.
nlohmann::json json_from_text(std::string_view text);

// A conversation's network as its column holds it: 'none', or the domains separated by spaces
// (an entry never has one).
std::string network_text(const NetworkPolicy& network);
NetworkPolicy network_from(std::string_view text);

// A list of names (a sandbox reference's files, a conversation's packages) from its JSON text;
// empty when it is not a list, non-strings left out.
std::vector<std::string> names_from_text(std::string_view text);

// Conversation ids name files (the SQLite store's turn locks), so both stores refuse the same
// ones.
bool valid_conversation_id(std::string_view id);

}  // namespace quarry::conversation
