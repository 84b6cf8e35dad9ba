// The history store's write rate, SQLite beside PostgreSQL: the writes one tool step makes
// (the assistant's message, its tool result, a stream event for each, an exec record), timed
// one at a time and from several writers at once (servers' workers writing to one history).
// Prints writes per second and the p50 / p90 of one write; asserts nothing.
//
// usage: history_bench STATE_DIR PORT [--steps 2000] [--writers 4]
//   PostgreSQL: the history database of quarry's private server in STATE_DIR on PORT (up);
//   SQLite: a file in the temporary directory. bench/multiserver.sh runs it.
#include <fmt/format.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "conversation/postgres_history_store.h"
#include "conversation/sqlite_history_store.h"
#include "data/postgres_server.h"
#include "percentiles.h"

namespace quarry {
namespace {

using conversation::HistoryStore;

struct Figures {
  double writes_per_second = 0;
  bench::Stats write_ms;
};

// One step's writes in `conversation`, turn `turn`; each write's time appended to `samples`.
Result<void> step(HistoryStore& history, const std::string& conversation, int turn, int64_t& seq,
                  std::vector<double>& samples) {
  auto timed = [&](auto&& write) -> Result<void> {
    const auto start = bench::Clock::now();
    auto written = write();
    samples.push_back(bench::ms_since(start));
    if (!written) return std::unexpected(written.error());
    return {};
  };
  conversation::Message call;
  call.turn = turn;
  call.role = conversation::Role::kAssistant;
  call.tool_calls = nlohmann::json::array(
      {{{"id", fmt::format("call_{}", seq)}, {"name", "run_python"}, {"arguments", "{}"}}});
  RETURN_IF_ERROR(timed([&] { return history.append_message(conversation, call); }));
  RETURN_IF_ERROR(timed([&] {
    return history.append_stream_event(
        conversation, {turn, ++seq, "tool_call", R"j({"tool":"run_python","code":"print(1)"})j"});
  }));
  conversation::ExecRecord exec;
  exec.turn = turn;
  exec.tool_call_id = fmt::format("call_{}", seq);
  exec.tool = "run_python";
  RETURN_IF_ERROR(timed([&] { return history.record_exec(conversation, exec); }));
  conversation::Message result;
  result.turn = turn;
  result.role = conversation::Role::kTool;
  result.tool_call_id = exec.tool_call_id;
  result.content = std::string(400, 'x');  // a short tool output
  RETURN_IF_ERROR(timed([&] { return history.append_message(conversation, result); }));
  return timed([&] {
    return history.append_stream_event(
        conversation, {turn, ++seq, "tool_result", R"({"ok":true,"output":"1\n"})"});
  });
}

// `writers` threads, each on a conversation of its own, making `steps` steps between them.
Result<Figures> measure(HistoryStore& history, int steps, int writers) {
  std::vector<std::vector<double>> samples(static_cast<size_t>(writers));
  std::vector<std::string> errors(static_cast<size_t>(writers));
  std::vector<std::string> conversations;
  for (int i = 0; i < writers; ++i) {
    ASSIGN_OR_RETURN(auto made, history.create_conversation(fmt::format("bench {}", i)));
    RETURN_IF_ERROR(history.begin_turn(made.id, conversation::TurnKind::kCell));
    conversations.push_back(made.id);
  }
  const auto start = bench::Clock::now();
  std::vector<std::thread> threads;
  for (int i = 0; i < writers; ++i) {
    threads.emplace_back([&, i] {
      int64_t seq = 0;
      const auto index = static_cast<size_t>(i);
      for (int n = i; n < steps; n += writers) {
        if (auto done = step(history, conversations[index], 1, seq, samples[index]); !done) {
          errors[index] = done.error().message;
          return;
        }
      }
    });
  }
  for (auto& thread : threads)
    thread.join();
  const double seconds = bench::ms_since(start) / 1000;
  for (const auto& error : errors) {
    if (!error.empty()) return make_error(ErrorCode::kInternal, "{}", error);
  }
  std::vector<double> all;
  for (const auto& some : samples)
    all.insert(all.end(), some.begin(), some.end());
  return Figures{static_cast<double>(all.size()) / seconds, bench::stats(std::move(all))};
}

int run(int argc, char** argv) {
  if (argc < 3) {
    fmt::print(stderr, "usage: history_bench STATE_DIR PORT [--steps N] [--writers N]\n");
    return 2;
  }
  auto conninfo =
      data::PostgresServer(argv[1], static_cast<uint16_t>(std::atoi(argv[2]))).history_conninfo();
  if (!conninfo) {
    fmt::print(stderr, "history_bench: {}\n", conninfo.error().message);
    return 1;
  }
  int steps = 2000, writers = 4;
  for (int i = 3; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--steps") steps = std::atoi(argv[i + 1]);
    if (flag == "--writers") writers = std::atoi(argv[i + 1]);
  }
  SystemClock clock;
  const auto directory = std::filesystem::temp_directory_path() / "quarry-history-bench";
  std::filesystem::remove_all(directory);
  std::filesystem::create_directories(directory);

  fmt::print(
      "history store write rate: {} steps of 5 writes each (2 messages, 2 stream events, "
      "an exec)\n",
      steps);
  fmt::print("{:<34} {:>12} {:>12} {:>12}\n", "store, writers", "writes/s", "p50 ms", "p90 ms");
  for (const int threads : {1, writers}) {
    for (const bool postgres : {false, true}) {
      Result<std::unique_ptr<HistoryStore>> store =
          postgres ? Result<std::unique_ptr<HistoryStore>>(
                         conversation::PostgresHistoryStore::open(*conninfo, clock))
                   : Result<std::unique_ptr<HistoryStore>>(conversation::SqliteHistoryStore::open(
                         directory / fmt::format("history-{}.db", threads), clock));
      if (!store) {
        fmt::print(stderr, "history_bench: {}\n", store.error().message);
        return 1;
      }
      auto figures = measure(**store, steps, threads);
      if (!figures) {
        fmt::print(stderr, "history_bench: {}\n", figures.error().message);
        return 1;
      }
      fmt::print("{:<34} {:>12.0f} {:>12.3f} {:>12.3f}\n",
                 fmt::format("{}, {} writer{}", postgres ? "PostgreSQL" : "SQLite", threads,
                             threads == 1 ? "" : "s"),
                 figures->writes_per_second, figures->write_ms.p50, figures->write_ms.p90);
    }
  }
  std::filesystem::remove_all(directory);
  return 0;
}

}  // namespace
}  // namespace quarry

int main(int argc, char** argv) {
  return quarry::run(argc, argv);
}
