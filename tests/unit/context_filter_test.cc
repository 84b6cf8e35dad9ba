#include "conversation/context_filter.h"

#include <gtest/gtest.h>

namespace quarry::conversation {
namespace {

Message message(int turn, Role role, std::string content) {
  Message m;
  m.turn = turn;
  m.role = role;
  m.content = std::move(content);
  return m;
}

TEST(ContextFilter, KeepsShortHistoriesAsTheyAre) {
  std::vector<Message> history = {message(1, Role::kUser, "how many rows?"),
                                  message(1, Role::kTool, "6351"),
                                  message(1, Role::kAssistant, "6,351 rows.")};
  auto visible = filter_context(history, {});
  ASSERT_EQ(visible.size(), 3u);
  for (size_t i = 0; i < 3; ++i)
    EXPECT_EQ(visible[i].content, history[i].content);
}

TEST(ContextFilter, CutsLongToolOutputWithAMarker) {
  std::string output = std::string(5000, 'a') + std::string(5000, 'z');
  auto visible = filter_context({message(1, Role::kTool, output)}, {.tool_output_chars = 1000});
  ASSERT_EQ(visible.size(), 1u);
  const auto& text = visible[0].content;
  EXPECT_LT(text.size(), 1200u);
  EXPECT_TRUE(text.starts_with(std::string(600, 'a')));
  EXPECT_TRUE(text.ends_with(std::string(400, 'z')));
  EXPECT_NE(text.find("[... 9000 characters cut; the full text is kept in the history ...]"),
            std::string::npos);
}

TEST(ContextFilter, SummarisesBulkyResultsOfOlderTurns) {
  std::vector<Message> history;
  for (int turn = 1; turn <= 4; ++turn) {
    history.push_back(message(turn, Role::kUser, "question"));
    history.push_back(message(turn, Role::kTool, std::string(3000, 'x')));
  }
  auto visible = filter_context(history, {.old_result_chars = 1000, .recent_turns = 2});
  ASSERT_EQ(visible.size(), history.size());
  EXPECT_NE(visible[1].content.find("turn 1, 3000 characters"), std::string::npos);
  EXPECT_NE(visible[3].content.find("turn 2, 3000 characters"), std::string::npos);
  EXPECT_EQ(visible[5].content, std::string(3000, 'x'));  // turn 3 is recent
  EXPECT_EQ(visible[7].content, std::string(3000, 'x'));
  EXPECT_EQ(visible[0].content, "question");  // users' words are never summarised
}

TEST(ContextFilter, CutsLongArgumentsOfOlderToolCallsKeepingThemJson) {
  Message call = message(1, Role::kAssistant, "");
  call.tool_calls = nlohmann::json::array(
      {{{"id", "c1"},
        {"name", "write_file"},
        {"arguments",
         nlohmann::json({{"path", "a.py"}, {"content", std::string(10000, 'p')}}).dump()}}});
  std::vector<Message> history = {call, message(5, Role::kUser, "now")};
  auto visible = filter_context(history, {.old_argument_chars = 2000, .recent_turns = 2});
  auto arguments = nlohmann::json::parse(visible[0].tool_calls[0]["arguments"].get<std::string>());
  EXPECT_EQ(arguments["path"], "a.py");
  EXPECT_LT(arguments["content"].get<std::string>().size(), 700u);
  EXPECT_NE(arguments["content"].get<std::string>().find("characters cut"), std::string::npos);
}

// Cut by bytes, the middle of a long value could split a character ("é" is two bytes): its
// JSON then could not be written, and every later turn of the conversation failed.
TEST(ContextFilter, CutsBetweenCharactersNotInsideOne) {
  Message call = message(1, Role::kAssistant, "");
  std::string code;
  while (code.size() < 10000)
    code += "x = 'température'  # é\n";
  for (const size_t limit : {2000, 2001, 2002, 2003}) {
    SCOPED_TRACE(limit);
    call.tool_calls =
        nlohmann::json::array({{{"id", "c1"},
                                {"name", "run_python"},
                                {"arguments", nlohmann::json({{"code", code}}).dump()}}});
    std::vector<Message> history = {call, message(5, Role::kUser, "now")};
    std::vector<Message> visible;
    ASSERT_NO_THROW(visible =
                        filter_context(history, {.old_argument_chars = limit, .recent_turns = 2}));
    auto arguments =
        nlohmann::json::parse(visible[0].tool_calls[0]["arguments"].get<std::string>());
    EXPECT_NE(arguments["code"].get<std::string>().find("characters cut"), std::string::npos);
  }
  for (size_t limit = 10; limit < 20; ++limit) {
    const std::string cut = cut_middle("éééééééééééééééééééééééé", limit);
    EXPECT_NO_THROW((void)nlohmann::json(cut).dump()) << cut;
  }
}

TEST(ContextFilter, DropsOldestTurnsWholeWhenOverBudget) {
  std::vector<Message> history;
  for (int turn = 1; turn <= 5; ++turn) {
    history.push_back(message(turn, Role::kUser, std::string(400, 'q')));
    history.push_back(message(turn, Role::kTool, std::string(400, 'r')));
  }
  auto visible = filter_context(history, {.budget_chars = 2000, .recent_turns = 5});
  ASSERT_FALSE(visible.empty());
  EXPECT_EQ(visible.front().turn, 4);  // turns 1-3 left out whole, never half a turn
  EXPECT_EQ(visible.back().turn, 5);
  EXPECT_EQ(visible.size(), 4u);
  // The current turn always stays, even alone over budget.
  auto tight = filter_context(history, {.budget_chars = 10, .recent_turns = 5});
  ASSERT_EQ(tight.size(), 2u);
  EXPECT_EQ(tight[0].turn, 5);
}

}  // namespace
}  // namespace quarry::conversation
