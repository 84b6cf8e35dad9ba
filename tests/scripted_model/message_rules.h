// The rules OpenAI's API checks on a request's messages, and the one a real model keeps when it
// answers (it calls only tools it was offered), so that no test passes against the scripted
// model with a conversation a real model would refuse.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "scenario.h"

namespace quarry::scripted_model {

// A broken rule in OpenAI's words: the "error" object of its HTTP 400 answer.
struct RuleViolation {
  std::string message;
  std::string param;  // "" = null
  std::string code;   // "" = null
};

// The first rule the body's "messages" break, in the order the real API checks them: the list's
// shape and each message's role first, then how tool messages answer tool calls. Nothing when
// the messages keep every rule.
std::optional<RuleViolation> check_messages(const nlohmann::json& body);

// "" when every tool the reply of step `index` calls is one the request lets the model call: the
// tools it offers, none with "tool_choice": "none", only the named one when tool_choice names a
// function. Else why the reply cannot be sent: the scenario, step, file and line, the tool and
// the tools offered.
std::string unoffered_tool_failure(const Scenario& scenario, size_t index, const Reply& reply,
                                   const Conversation& conversation,
                                   const nlohmann::json& tool_choice);

}  // namespace quarry::scripted_model
