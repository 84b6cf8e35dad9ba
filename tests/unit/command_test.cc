#include "common/command.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "common/file_util.h"
#include "common/unique_fd.h"

namespace quarry {
namespace {

TEST(RunCommand, ANonzeroExitNamesTheCommandAndWhatItLastPrinted) {
  CommandOptions options;
  options.name = "the probe";
  auto ran = run_command({"sh", "-c", "echo first; echo last; exit 3"}, options);
  ASSERT_FALSE(ran);
  EXPECT_EQ(ran.error().message, "'the probe' exited with status 3; its last output:\nfirst\nlast");
}

// A cancelled command goes with whatever it started: argv[0] may be a wrapper (pyenv's python3
// is a script that starts the real one), and killing only the wrapper left the real one running.
TEST(RunCommand, ACancelledCommandIsStoppedWithWhatItStarted) {
  const auto pid_file =
      std::filesystem::temp_directory_path() / fmt::format("quarry-command-{}", ::getpid());
  std::filesystem::remove(pid_file);
  UniqueFd cancel(::eventfd(0, EFD_CLOEXEC));
  std::thread canceller([&] {
    for (int i = 0; i < 600 && !std::filesystem::exists(pid_file); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const uint64_t one = 1;
    EXPECT_EQ(::write(cancel.get(), &one, sizeof one), 8);
  });
  CommandOptions options;
  options.cancel_fd = cancel.get();
  options.name = "the wrapper";
  auto ran = run_command({"sh", "-c",
                          fmt::format("sleep 600 & echo $! > {}.part && mv {}.part {}; wait",
                                      pid_file.string(), pid_file.string(), pid_file.string())},
                         options);
  canceller.join();
  ASSERT_FALSE(ran);
  EXPECT_EQ(ran.error().code, ErrorCode::kCancelled);
  EXPECT_EQ(ran.error().message, "'the wrapper' was stopped: cancelled");
  auto text = read_file(pid_file);
  ASSERT_TRUE(text);
  const pid_t sleeper = std::stoi(*text);
  // Gone, or a zombie waiting for its new parent to reap it.
  bool gone = false;
  for (int i = 0; i < 100 && !gone; ++i) {
    auto stat = read_file(fmt::format("/proc/{}/stat", sleeper));
    gone = !stat || stat->find(") Z ") != std::string::npos;
    if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(gone) << "what the command started still runs";
  if (!gone) ::kill(sleeper, SIGKILL);
  std::filesystem::remove(pid_file);
}

}  // namespace
}  // namespace quarry
