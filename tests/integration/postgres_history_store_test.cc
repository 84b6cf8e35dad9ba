// The HistoryStore suite on PostgreSQL (a database of its own per test on the data tests'
// server), and what only a shared PostgreSQL history has to do: servers migrating at once, turn
// locks between servers released when one dies, a database that is not quarry's.
#include "conversation/postgres_history_store.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <functional>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "conversation/open_history_store.h"
#include "data/connection.h"
#include "history_store_suite.h"
#include "postgres_environment.h"

namespace quarry::conversation {
namespace {

using quarry::testing::PostgresEnvironment;
using testing::HistoryStoreSuite;

// Every row of `sql`'s result, fields separated by '|', rows by newlines.
std::string query_text(const std::string& conninfo, const std::string& sql) {
  auto connection = data::Connection::open(conninfo);
  EXPECT_TRUE(connection) << connection.error().message;
  if (!connection) return "";
  auto result = connection->exec(sql);
  EXPECT_TRUE(result) << sql << ": " << result.error().message;
  if (!result) return "";
  std::string text;
  for (int row = 0; row < PQntuples(result->get()); ++row) {
    for (int column = 0; column < PQnfields(result->get()); ++column) {
      text += PQgetvalue(result->get(), row, column);
      text += '|';
    }
    text += '\n';
  }
  return text;
}

// A new, empty database on the test server, dropped with the backend.
class PostgresBackend final : public testing::HistoryBackend {
 public:
  PostgresBackend() {
    static std::atomic<int> counter = 0;
    name_ = fmt::format("history_{}_{}", ::getpid(), counter++);
    // One statement a call: a script runs as one transaction, which CREATE DATABASE refuses.
    admin_sql(fmt::format("DROP DATABASE IF EXISTS {}", name_));
    admin_sql(fmt::format("CREATE DATABASE {}", name_));
    // In a key=value string the last dbname wins.
    url_ = fmt::format("{} dbname={}", PostgresEnvironment::get().server().admin_conninfo, name_);
  }
  ~PostgresBackend() override { admin_sql(fmt::format("DROP DATABASE {} WITH (FORCE)", name_)); }

  Result<std::unique_ptr<HistoryStore>> open(const Clock& clock) override {
    ASSIGN_OR_RETURN(auto store, PostgresHistoryStore::open(url_, clock));
    return store;
  }
  void set_schema_version(int version) override {
    query_text(url_, fmt::format("INSERT INTO schema_version (version) VALUES ({})", version));
  }
  std::string fingerprint() override {
    std::string text =
        query_text(url_,
                   "SELECT table_name, column_name, data_type FROM information_schema.columns "
                   "WHERE table_schema = current_schema() ORDER BY table_name, ordinal_position");
    text += query_text(url_, "SELECT version, applied_at FROM schema_version ORDER BY version");
    text += query_text(url_, "SELECT * FROM conversations ORDER BY id");
    return text;
  }
  bool keeps_any_bytes() const override { return false; }
  bool keeps_artifact_contents() const override { return true; }

  const std::string& url() const { return url_; }

 private:
  static void admin_sql(const std::string& sql) { quarry::testing::admin_sql(sql); }
  std::string name_;
  std::string url_;
};

INSTANTIATE_TEST_SUITE_P(Postgres, HistoryStoreSuite,
                         ::testing::Values(testing::HistoryBackendFactory{
                             "Postgres", [] { return std::make_unique<PostgresBackend>(); }}),
                         testing::backend_name);

class PostgresHistoryTest : public ::testing::Test {
 protected:
  std::unique_ptr<PostgresHistoryStore> open() {
    auto store = PostgresHistoryStore::open(backend_.url(), clock_);
    EXPECT_TRUE(store) << store.error().message;
    return store ? std::move(*store) : nullptr;
  }
  // The backend that holds a conversation's turn lock ("" when none does).
  std::string lock_holder(std::string_view conversation_id) {
    const auto key = static_cast<uint64_t>(PostgresHistoryStore::turn_lock_key(conversation_id));
    auto text = query_text(backend_.url(),
                           fmt::format("SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND "
                                       "granted AND classid = {} AND objid = {} AND objsubid = 1",
                                       key >> 32, key & 0xffffffffu));
    if (!text.empty()) text.resize(text.find('|'));
    return text;
  }
  // Waits up to 10 s for `condition`.
  template <typename Condition>
  bool eventually(Condition&& condition) {
    for (int i = 0; i < 200; ++i) {
      if (condition()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }

  PostgresBackend backend_;
  ManualClock clock_;
};

// `servers` threads at once, each with a store of its own on `url`, each doing `work` with its
// number; the error of each (empty when it did all of it).
std::vector<std::string> at_once(
    const std::string& url, int servers,
    const std::function<Result<void>(PostgresHistoryStore&, int)>& work) {
  std::vector<std::string> errors(static_cast<size_t>(servers));
  std::vector<std::thread> threads;
  for (int i = 0; i < servers; ++i) {
    threads.emplace_back([&, i] {
      ManualClock clock;
      auto store = PostgresHistoryStore::open(url, clock);
      auto done = store ? work(**store, i) : Result<void>(std::unexpected(store.error()));
      if (!done) errors[static_cast<size_t>(i)] = done.error().message;
    });
  }
  for (auto& thread : threads)
    thread.join();
  return errors;
}

// Servers starting at once on a new database: one of them creates the schema, the others wait
// for it and find it made.
TEST_F(PostgresHistoryTest, ServersStartingAtOnceMigrateOnce) {
  constexpr int kServers = 6;
  std::atomic<int> opened = 0;
  const auto errors =
      at_once(backend_.url(), kServers, [&](PostgresHistoryStore& store, int i) -> Result<void> {
        RETURN_IF_ERROR(store.create_conversation(fmt::format("server {}", i)));
        ++opened;
        return {};
      });
  for (const auto& error : errors)
    EXPECT_EQ(error, "");
  EXPECT_EQ(opened, kServers);
  std::string versions;  // each migration once, from the first (5) to this build's
  for (int version = 5; version <= PostgresHistoryStore::kSchemaVersion; ++version)
    versions += fmt::format("{}|\n", version);
  EXPECT_EQ(query_text(backend_.url(), "SELECT version FROM schema_version ORDER BY version"),
            versions);
  EXPECT_EQ(query_text(backend_.url(), "SELECT count(*) FROM conversations"), "6|\n");
}

// Servers taking sandbox places at once, each with a store of its own: the limits hold over all
// of them (never one place too many), a user's limit too, and a server's places go with it when
// another took it over.
TEST_F(PostgresHistoryTest, SandboxPlacesHoldTheLimitsAcrossServersTakingAtOnce) {
  constexpr int kServers = 6, kTries = 4;
  const capacity::PlaceLimits limits{5, 3, 8};
  std::atomic<int> taken = 0, alices = 0;
  const auto errors =
      at_once(backend_.url(), kServers, [&](PostgresHistoryStore& store, int i) -> Result<void> {
        for (int n = 0; n < kTries; ++n) {
          const std::string user = n % 2 == 0 ? "alice" : "bob";
          ASSIGN_OR_RETURN(bool took, store.take_place({fmt::format("s{}/{}", i, n),
                                                        fmt::format("s{}", i), user, "local", ""},
                                                       limits));
          if (took) {
            ++taken;
            if (user == "alice") ++alices;
          }
        }
        return {};
      });
  for (const auto& error : errors)
    EXPECT_EQ(error, "");
  EXPECT_EQ(taken, 5);  // of 24 tries
  EXPECT_LE(alices, 3);
  EXPECT_EQ(query_text(backend_.url(), "SELECT count(*) FROM sandbox_places"), "5|\n");

  ManualClock clock;
  auto store = PostgresHistoryStore::open(backend_.url(), clock);
  ASSERT_TRUE(store) << store.error().message;
  auto everyone = (*store)->places_held("nobody");
  ASSERT_TRUE(everyone) << everyone.error().message;
  EXPECT_EQ(everyone->total, 5);
  EXPECT_EQ(everyone->by_account["local"], 5);
  // A server taken over loses its places with its record, once that is done; a full server is
  // refused.
  const std::string holder =
      query_text(backend_.url(), "SELECT server FROM sandbox_places LIMIT 1");
  const std::string server = holder.substr(0, holder.find('|'));
  ASSERT_TRUE((*store)->enter({server, "x", "http://127.0.0.1:1", {}, {}, {}}));
  EXPECT_FALSE(*(*store)->take_place({"late/1", "late", "carol", "local", ""}, limits));
  auto claim = (*store)->claim(server, std::chrono::milliseconds(-1000));
  ASSERT_TRUE(claim && *claim);
  EXPECT_FALSE(*(*store)->take_place({"late/1", "late", "carol", "local", ""}, limits));
  ASSERT_TRUE((*store)->taken_over(**claim));
  auto after = (*store)->places_held("nobody");
  ASSERT_TRUE(after);
  EXPECT_LT(after->total, 5);
  EXPECT_TRUE(*(*store)->take_place({"late/1", "late", "carol", "local", ""}, limits));
}

// A conversation's turns go to any server: its sandbox's place goes to the server that goes on
// with it (one place, whoever made it), and whichever server destroys the sandbox frees its
// place, by the sandbox's id.
TEST_F(PostgresHistoryTest, ASandboxsPlaceMovesToTheServerGoingOnWithItAndGoesWithIt) {
  auto store = open();
  const capacity::PlaceLimits limits{4, 4, 4};
  ASSERT_TRUE(*store->take_place({"a/1", "a", "alice", "local", ""}, limits));
  ASSERT_TRUE(*store->take_place({"a/2", "a", "bob", "local", ""}, limits));
  ASSERT_TRUE(store->name_place("a/1", "s1"));
  auto places = [&] {
    return query_text(backend_.url(),
                      "SELECT key, server, sandbox_id FROM sandbox_places ORDER BY key");
  };
  EXPECT_EQ(places(), "a/1|a|s1|\na/2|a||\n");

  ASSERT_TRUE(store->keep_place({"b/7", "b", "alice", "local", "s1"}));
  EXPECT_EQ(places(), "a/2|a||\nb/7|b|s1|\n");
  ASSERT_TRUE(store->keep_place({"b/7", "b", "alice", "local", "s1"}));  // b's next turn
  EXPECT_EQ(places(), "a/2|a||\nb/7|b|s1|\n");
  auto seen_by_a = store->places_held("a");
  ASSERT_TRUE(seen_by_a) << seen_by_a.error().message;
  EXPECT_EQ(seen_by_a->own, std::set<std::string>{"a/2"});
  EXPECT_EQ(seen_by_a->total, 1);
  EXPECT_EQ(seen_by_a->by_user["alice"], 1);
  auto seen_by_b = store->places_held("b");
  EXPECT_EQ(seen_by_b->own, std::set<std::string>{"b/7"});
  EXPECT_EQ(seen_by_b->total, 1);
  EXPECT_EQ(seen_by_b->by_user["bob"], 1);

  // Back to a, under the key of its earlier lease.
  ASSERT_TRUE(store->keep_place({"a/1", "a", "alice", "local", "s1"}));
  EXPECT_EQ(places(), "a/1|a|s1|\na/2|a||\n");
  // Destroyed through b, which does not hold it: its place goes all the same; a key alone
  // frees only its own.
  ASSERT_TRUE(store->free_place("", "s1"));
  EXPECT_EQ(places(), "a/2|a||\n");
  ASSERT_TRUE(store->free_place("a/3", ""));
  EXPECT_EQ(places(), "a/2|a||\n");
  ASSERT_TRUE(store->free_place("a/2", ""));
  EXPECT_EQ(places(), "");
}

// Taking over a silent server: one claim of those at once wins; the record stays until the
// takeover is done, so one cut short (its claimer died) is claimed again once silent as long;
// a server that beat after the claim (alive after all) keeps its record.
TEST_F(PostgresHistoryTest, ATakeoverCutShortIsClaimedAgainAndAliveServersKeepTheirRecord) {
  using std::chrono::milliseconds;
  constexpr milliseconds kTimeout(1000);
  auto store = open();
  ASSERT_TRUE(store->enter({"dead", "a", "http://127.0.0.1:1", {}, {}, {}}));
  ASSERT_TRUE(store->enter({"slow", "b", "http://127.0.0.1:2", {}, {}, {}}));
  std::this_thread::sleep_for(milliseconds(1100));
  std::atomic<int> claims = 0;
  const auto errors =
      at_once(backend_.url(), 4, [&](PostgresHistoryStore& other, int) -> Result<void> {
        ASSIGN_OR_RETURN(auto claim, other.claim("dead", kTimeout));
        claims += claim.has_value();
        return {};
      });
  for (const auto& error : errors)
    EXPECT_EQ(error, "");
  EXPECT_EQ(claims, 1);
  // The claim counts as its heartbeat: not claimable again at once, and still listed.
  auto again = store->claim("dead", kTimeout);
  ASSERT_TRUE(again) << again.error().message;
  EXPECT_FALSE(*again);
  EXPECT_NE(query_text(backend_.url(), "SELECT boot_id FROM servers WHERE boot_id = 'dead'"), "");
  // Its claimer died without `taken_over`: once silent again, the next claim gets it and ends it.
  std::this_thread::sleep_for(milliseconds(1100));
  auto anew = store->claim("dead", kTimeout);
  ASSERT_TRUE(anew && *anew);
  ASSERT_TRUE(store->taken_over(**anew));
  EXPECT_EQ(query_text(backend_.url(), "SELECT boot_id FROM servers WHERE boot_id = 'dead'"), "");
  // Claimed while alive: its next beat succeeds, and the takeover leaves its record.
  auto slow = store->claim("slow", kTimeout);
  ASSERT_TRUE(slow && *slow);
  std::this_thread::sleep_for(milliseconds(5));
  ASSERT_TRUE(*store->beat("slow"));
  ASSERT_TRUE(store->taken_over(**slow));
  EXPECT_EQ(query_text(backend_.url(), "SELECT boot_id FROM servers WHERE boot_id = 'slow'"),
            "slow|\n");
}

// A request for room reaches every listening server with its id, the asking server and the
// user; of the servers claiming it at once exactly one gets it; a request older than a minute
// is claimed by none and goes with the next request.
TEST_F(PostgresHistoryTest, ARequestForRoomIsHeardByEveryServerAndClaimedByOne) {
  auto asking = open();
  std::mutex mutex;
  std::vector<RoomRequest> heard;
  std::vector<std::unique_ptr<PostgresHistoryStore>> others;
  std::vector<std::unique_ptr<Subscription>> listening;
  for (int i = 0; i < 2; ++i) {
    others.push_back(open());
    Listeners listeners;
    listeners.on_room = [&](const RoomRequest& request) {
      std::lock_guard lock(mutex);
      heard.push_back(request);
    };
    auto subscription = others.back()->listen(std::move(listeners));
    ASSERT_TRUE(subscription) << subscription.error().message;
    listening.push_back(std::move(*subscription));
  }
  auto count_heard = [&] {
    std::lock_guard lock(mutex);
    return heard.size();
  };
  ASSERT_TRUE(asking->request_room("boot-a", "alice smith"));
  ASSERT_TRUE(eventually([&] { return count_heard() == 2; })) << count_heard();
  const RoomRequest first = heard[0];
  EXPECT_GT(first.id, 0);
  EXPECT_EQ(first.server, "boot-a");
  EXPECT_EQ(first.user, "alice smith");
  EXPECT_EQ(heard[1].id, first.id);

  std::atomic<int> claims = 0;
  const auto errors =
      at_once(backend_.url(), 4, [&](PostgresHistoryStore& other, int) -> Result<void> {
        ASSIGN_OR_RETURN(bool mine, other.claim_room(first.id));
        claims += mine;
        return {};
      });
  for (const auto& error : errors)
    EXPECT_EQ(error, "");
  EXPECT_EQ(claims, 1);
  EXPECT_FALSE(*asking->claim_room(first.id)) << "claimed twice";

  // Anyone's room (no user), then left unclaimed past its minute.
  ASSERT_TRUE(asking->request_room("boot-a", ""));
  ASSERT_TRUE(eventually([&] { return count_heard() == 4; })) << count_heard();
  const RoomRequest second = heard[2];
  EXPECT_NE(second.id, first.id);
  EXPECT_EQ(second.user, "");
  query_text(
      backend_.url(),
      fmt::format("UPDATE room_requests SET asked_at = asked_at - 61000 WHERE id = {}", second.id));
  EXPECT_FALSE(*others[0]->claim_room(second.id)) << "a request of a minute ago was claimed";
  ASSERT_TRUE(asking->request_room("boot-a", "bob"));
  EXPECT_EQ(query_text(backend_.url(), "SELECT user_name FROM room_requests"), "bob|\n");
}

// A delete is remembered for the servers that were not listening: asked about ids, the store
// names those deleted in the last 30 days (not those alive, unknown or deleted longer ago), and
// forgets those older than that at the next delete.
TEST_F(PostgresHistoryTest, DeletedConversationsAreRememberedForThirtyDays) {
  auto store = open();
  const auto kept = store->create_conversation("kept")->id;
  const auto deleted = store->create_conversation("deleted")->id;
  const auto old = store->create_conversation("deleted long ago")->id;
  ASSERT_TRUE(store->delete_conversation(deleted));
  ASSERT_TRUE(store->delete_conversation(old));
  const std::vector<std::string> asked = {kept, deleted, old, "never-there", "it's \"odd\" {,}"};
  auto found = store->deleted_among(asked);
  ASSERT_TRUE(found) << found.error().message;
  std::vector<std::string> expected = {deleted, old};
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(*found, expected);

  const auto day_ms = 24LL * 3600 * 1000;
  query_text(backend_.url(),
             fmt::format("UPDATE deleted_conversations SET deleted_at = deleted_at - {} WHERE "
                         "id = '{}'",
                         31 * day_ms, old));
  EXPECT_EQ(*store->deleted_among(asked), std::vector<std::string>{deleted});
  ASSERT_TRUE(store->delete_conversation(store->create_conversation("another")->id));
  EXPECT_EQ(
      query_text(backend_.url(),
                 fmt::format("SELECT count(*) FROM deleted_conversations WHERE id = '{}'", old)),
      "0|\n")
      << "a delete of 31 days ago was not forgotten";
  EXPECT_EQ(*store->deleted_among({}), std::vector<std::string>{});
}

// pg_terminate_backend of the lock's session is what PostgreSQL sees when a server dies: the
// lock is free for the next server, and the first one's store goes on with new connections.
TEST_F(PostgresHistoryTest, ATurnLockIsReleasedWhenItsSessionIsTerminated) {
  auto first = open();
  auto second = open();
  auto id = first->create_conversation("c")->id;
  auto held = first->try_lock_turn(id);
  ASSERT_TRUE(held) << held.error().message;
  EXPECT_EQ(second->try_lock_turn(id).error().code, ErrorCode::kAborted);
  const auto pid = lock_holder(id);
  ASSERT_NE(pid, "");
  EXPECT_EQ(query_text(backend_.url(), fmt::format("SELECT pg_terminate_backend({})", pid)),
            "t|\n");
  EXPECT_TRUE(eventually([&] { return static_cast<bool>(second->try_lock_turn(id)); }));
  held->reset();  // its session is gone: the connection is closed, not given back
  EXPECT_TRUE(first->conversation(id));
}

// The holder of a watched lock hears that it lost it (and so must stop its turn); a lock given
// up as usual says nothing.
TEST_F(PostgresHistoryTest, AWatchedTurnLockTellsItsHolderThatItsSessionEnded) {
  auto store = open();
  auto id = store->create_conversation("c")->id;
  std::atomic<int> lost = 0;
  {
    auto released = store->try_lock_turn(id);
    ASSERT_TRUE(released) << released.error().message;
    (*released)->watch([&] { ++lost; });
  }
  auto held = store->try_lock_turn(id);
  ASSERT_TRUE(held) << held.error().message;
  (*held)->watch([&] { ++lost; });
  EXPECT_EQ(lost, 0);
  const auto pid = lock_holder(id);
  ASSERT_NE(pid, "");
  EXPECT_EQ(query_text(backend_.url(), fmt::format("SELECT pg_terminate_backend({})", pid)),
            "t|\n");
  EXPECT_TRUE(eventually([&] { return lost == 1; })) << "the loss went unheard";
  held->reset();
  EXPECT_EQ(lost, 1);
}

// A server killed with its turn running: the session ends with the process, and so its lock.
TEST_F(PostgresHistoryTest, ATurnLockIsReleasedWhenItsProcessIsKilled) {
  auto store = open();
  auto id = store->create_conversation("c")->id;
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t server = ::fork();
  if (server == 0) {
    ManualClock clock;
    auto other = PostgresHistoryStore::open(backend_.url(), clock);
    if (!other) ::_exit(1);
    auto lock = (*other)->try_lock_turn(id);
    if (!lock) ::_exit(2);
    (void)!::write(ready[1], "x", 1);
    ::pause();
    ::_exit(0);
  }
  ::close(ready[1]);
  char byte = 0;
  ASSERT_EQ(::read(ready[0], &byte, 1), 1) << "the child did not take the lock";
  ::close(ready[0]);
  auto refused = store->try_lock_turn(id);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code, ErrorCode::kAborted);
  EXPECT_NE(refused.error().message.find("already has a turn running"), std::string::npos);
  ASSERT_EQ(::kill(server, SIGKILL), 0);
  int status = 0;
  ::waitpid(server, &status, 0);
  EXPECT_TRUE(eventually([&] { return static_cast<bool>(store->try_lock_turn(id)); }));
}

TEST_F(PostgresHistoryTest, RefusesADatabaseWithAnotherApplicationsTablesAndLeavesIt) {
  query_text(backend_.url(), "CREATE TABLE conversations (topic text)");
  const auto before = query_text(backend_.url(),
                                 "SELECT table_name FROM information_schema.tables "
                                 "WHERE table_schema = current_schema() ORDER BY 1");
  auto store = PostgresHistoryStore::open(backend_.url(), clock_);
  ASSERT_FALSE(store);
  EXPECT_EQ(store.error().code, ErrorCode::kFailedPrecondition);
  EXPECT_NE(store.error().message.find("(conversations) but no quarry schema_version"),
            std::string::npos)
      << store.error().message;
  EXPECT_EQ(query_text(backend_.url(),
                       "SELECT table_name FROM information_schema.tables "
                       "WHERE table_schema = current_schema() ORDER BY 1"),
            before);
}

// A server it cannot reach is named by its key, never by the URL (it may hold a password).
TEST_F(PostgresHistoryTest, AnUnreachableServerIsNamedByTheKeyNotTheUrl) {
  Config config;
  config.conversations.store = "postgres";
  config.conversations.url = "postgresql://quarry:s3cret-word@127.0.0.1:1/history";
  auto store = open_history_store(config.conversations, "/nonexistent", clock_);
  ASSERT_FALSE(store);
  EXPECT_EQ(store.error().code, ErrorCode::kUnavailable);
  EXPECT_NE(store.error().message.find("opening the history in PostgreSQL (conversations.url)"),
            std::string::npos)
      << store.error().message;
  EXPECT_EQ(store.error().message.find("s3cret-word"), std::string::npos);
}

TEST_F(PostgresHistoryTest, TheConfigurationOpensThePostgresStore) {
  Config config;
  config.conversations.store = "postgres";
  config.conversations.url = backend_.url();
  auto store = open_history_store(config.conversations, "/nonexistent", clock_);
  ASSERT_TRUE(store) << store.error().message;
  auto id = (*store)->create_conversation("through the config")->id;
  EXPECT_EQ(open()->conversation(id)->title, "through the config");
}

}  // namespace
}  // namespace quarry::conversation
