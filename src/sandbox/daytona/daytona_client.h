// Daytona's API as quarry calls it: the main API (sandboxes) and each sandbox's toolbox
// (commands and files), over HTTP with a deadline on every call, retries with backoff where a
// call may succeed later (429 with its Retry-After, 502/503/504, a broken connection before an
// answer; never a create or a command that may have happened), and errors that say which call
// failed and why. The API key goes into the Authorization header and nowhere else: no log line
// or error message holds it. Contract: ../shared/reference/daytona-api.md and docs/daytona.md.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"
#include "common/http_client.h"
#include "common/retry_policy.h"
#include "common/url.h"

namespace quarry::sandbox::daytona {

struct ClientOptions {
  Url api_url;  // the main API's base (".../api")
  std::string api_key;
  Duration request_timeout = std::chrono::seconds(60);
  Duration connect_timeout = std::chrono::seconds(10);
  uint32_t max_retries = 4;
  std::string ca_file;
  BackoffPolicy backoff{.initial = std::chrono::milliseconds(200), .max = std::chrono::seconds(5)};
};

// What process/execute answered: the exit code and the combined output, or a timeout (408).
struct Executed {
  int exit_code = 0;
  std::string result;
  bool timed_out = false;
};

class DaytonaClient {
 public:
  static Result<DaytonaClient> create(ClientOptions options);

  // The main API. A sandbox is Daytona's Sandbox object (id, state, labels, toolboxProxyUrl...).
  // create is sent once: an answer lost on the way is for the caller to look for (by a label it
  // set), as a second POST could make a second sandbox.
  Result<nlohmann::json> create_sandbox(const nlohmann::json& body) const;
  Result<nlohmann::json> get_sandbox(std::string_view id) const;  // kNotFound once destroyed
  // Every sandbox whose labels include `labels`, through the cursor-paged list (also a server
  // that answers the older plain array).
  Result<std::vector<nlohmann::json>> list_sandboxes(
      const std::map<std::string, std::string>& labels) const;
  Result<void> delete_sandbox(std::string_view id) const;  // asynchronous in Daytona

  // The toolbox of one sandbox, at `toolbox` = its toolboxProxyUrl. `timeout_seconds` (0 for
  // none) is the daemon's: it kills the command's process group and answers 408. quarry waits
  // for the answer until `deadline` (default: the timeout and 5 s, else request_timeout).
  Result<Executed> execute(const Url& toolbox, std::string_view id, std::string_view command,
                           std::string_view cwd, const std::map<std::string, std::string>& envs,
                           int timeout_seconds, Duration deadline = {}) const;
  // Stops with kCancelled once `cancel_fd` (-1: none) is readable.
  Result<void> upload(const Url& toolbox, std::string_view id, std::string_view path,
                      std::string data, int cancel_fd) const;
  // The file's bytes through files/bulk-download, as the SDK fetches every file (a part named
  // "file" with the path as its filename, or "error" with Daytona's error JSON: its statusCode
  // as the error's code); kResourceExhausted past `max_bytes`, kCancelled once `cancel_fd`
  // (-1: none) is readable.
  Result<std::string> download(const Url& toolbox, std::string_view id, std::string_view path,
                               uint64_t max_bytes, int cancel_fd) const;
  Result<nlohmann::json> list_files(const Url& toolbox, std::string_view id,
                                    std::string_view path) const;
  Result<void> create_folder(const Url& toolbox, std::string_view id, std::string_view path,
                             std::string_view mode) const;

 private:
  struct Call {
    std::string method{};
    const Url* base = nullptr;
    std::string path{};  // below the base, with its query
    std::string body{};
    std::string content_type{};
    Duration timeout{};     // the whole call; default: request_timeout
    bool retry = true;      // false: only when the server surely did nothing (429)
    uint64_t max_body = 0;  // kept of the answer; default: the client's
    int cancel_fd = -1;     // readable: stop the call, and the retries, with kCancelled
  };
  DaytonaClient(ClientOptions options, HttpClient http);
  // The answer to `call`, after the retries it allows; an error for a status >= 400 unless
  // `expected` holds it (e.g. 404, 408).
  Result<HttpResponse> send(const Call& call, std::initializer_list<int> expected = {}) const;
  Result<nlohmann::json> send_json(const Call& call) const;

  ClientOptions options_;
  HttpClient http_;  // one for every call: each sets its own deadline and body limit
};

// Daytona's error body ({statusCode, error, message}) as one line: the message (or messages),
// or the body's start when it is not JSON.
std::string error_message(int status, std::string_view body);

}  // namespace quarry::sandbox::daytona
