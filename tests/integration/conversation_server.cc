// A stand-in for a quarry server process, for tests that kill one: it runs a
// ConversationManager the way a server does (orphans cleaned at start, sandboxes deleted on
// SIGTERM or SIGINT), holds a few conversations with live sandboxes, and waits.
//
//   conversation_server STATE_DIR CACHE_DIR HISTORY_DB INSTANCE CONVERSATIONS
//
// Prints "orphans N", then "ready ID..." once its conversations have sandboxes, then on
// SIGTERM "shutdown N" and exits 0.
#include <signal.h>

#include <cstdio>
#include <string>

#include "conversation/conversation_manager.h"
#include "conversation/sqlite_history_store.h"
#include "sandbox/local/local_provider.h"

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: %s STATE_DIR CACHE_DIR HISTORY_DB INSTANCE CONVERSATIONS\n",
                 argv[0]);
    return 2;
  }
  auto fail = [](const quarry::Error& error) {
    std::fprintf(stderr, "conversation_server: %s\n", error.message.c_str());
    return 1;
  };
  // Signals are taken synchronously below; block them before any thread exists.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  sigprocmask(SIG_BLOCK, &stop, nullptr);

  quarry::Config config;
  auto self = std::filesystem::read_symlink("/proc/self/exe");
  auto provider = quarry::sandbox::local::LocalProvider::open(
      config.sandbox,
      {argv[1], argv[2], self.parent_path().parent_path() / "src/quarry-init",
       config.capacity.overcommit, self.parent_path().parent_path() / "src/quarry-proxy"});
  if (!provider) return fail(provider.error());
  quarry::SystemClock clock;
  auto history = quarry::conversation::SqliteHistoryStore::open(argv[3], clock);
  if (!history) return fail(history.error());
  quarry::conversation::ManagerOptions options;
  options.instance_id = argv[4];
  options.spec.resources = config.sandbox.resources;
  quarry::conversation::ConversationManager manager(**provider, **history, clock, options);

  auto orphans = manager.destroy_orphans();
  if (!orphans) return fail(orphans.error());
  std::printf("orphans %d\n", *orphans);

  std::string ready = "ready";
  for (int i = 0; i < std::stoi(argv[5]); ++i) {
    auto conversation = (*history)->create_conversation("held by the test server");
    if (!conversation) return fail(conversation.error());
    auto turn = manager.begin_turn(conversation->id);
    if (!turn) return fail(turn.error());
    quarry::sandbox::ExecRequest request;
    request.argv = {"sh", "-c", "echo work > /home/sandbox/work.txt"};
    auto run = (*turn)->sandbox().execute(request);
    if (!run) return fail(run.error());
    ready += " " + conversation->id;
  }
  std::printf("%s\n", ready.c_str());
  std::fflush(stdout);

  int signal = 0;
  sigwait(&stop, &signal);
  auto deleted = manager.shutdown();
  if (!deleted) return fail(deleted.error());
  std::printf("shutdown %d\n", *deleted);
  return 0;
}
