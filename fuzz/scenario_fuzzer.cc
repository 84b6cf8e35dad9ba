// Fuzzes parse_scenario with scenario files of the scripted model server (tests/scripted_model)
// and, for what it accepts, picks each step's reply for a small conversation.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "scenario.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace model = quarry::scripted_model;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto scenario = model::parse_scenario(text, "scenario.yml", "scenario");
  if (!scenario) return 0;
  model::Conversation conversation;
  conversation.tools = {"query_database", "run_python"};
  conversation.messages = {{.role = "system", .content = "You analyse data."},
                           {.role = "user", .content = "Median peak views per category?"},
                           {.role = "tool", .content = "Killed: command ran out of memory."}};
  for (size_t step_idx = 0; step_idx < scenario->steps.size(); ++step_idx)
    (void)model::choose_reply(*scenario, step_idx, conversation);
  (void)model::step_index(*scenario, conversation);
  return 0;
}
