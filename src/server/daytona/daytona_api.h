// The Daytona-compatible API: the paths of Daytona's main API (/daytona/api/...) and of its
// toolbox (/daytona/toolbox/{sandboxId}/...) that Daytona's official SDK uses, answered with
// quarry's own sandboxes, so that code written for Daytona runs on quarry by changing
// DAYTONA_API_URL (docs/daytona.md: what is served, what each maps to, what differs and why).
// Requests are authenticated as the rest of the API's; each sandbox is its creator's, and
// another user's is as unknown as a missing one. Handlers block (sandbox calls) and run on a
// pool of their own.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "config/config.h"
#include "sandbox/provider.h"
#include "server/api.h"
#include "server/daytona/sandboxes.h"

namespace quarry::server::daytona {

// Every path of the Daytona-compatible API starts with it.
inline constexpr std::string_view kPathPrefix = "/daytona/";

inline bool is_daytona_path(std::string_view path) {
  return path.starts_with(kPathPrefix);
}

// The path of the upload route, whose body may be larger than server.max_body (up to
// server.max_file_transfer).
bool is_upload_path(std::string_view path);

// An error's body as Daytona writes it for `path`: the main API's {path, timestamp, statusCode,
// error, message}, or the toolbox's {statusCode, message, code, timestamp, path, method}.
nlohmann::json error_body(const ApiError& error, std::string_view method, std::string_view path);

class DaytonaApi {
 public:
  struct Services {
    const Config& config;
    Sandboxes& sandboxes;
    sandbox::SandboxProvider& provider;
  };
  explicit DaytonaApi(Services services) : services_(services) {}

  // `request.route` is not used: the Daytona paths have a router of their own.
  ApiReply handle(const ApiRequest& request);

 private:
  ApiResult<ApiReply> dispatch(const ApiRequest& request);

  ApiResult<ApiReply> create(const ApiRequest& request);
  ApiResult<ApiReply> list(const ApiRequest& request);
  ApiResult<ApiReply> read(const ApiRequest& request, std::string_view id);
  ApiResult<ApiReply> remove(const ApiRequest& request, std::string_view id);
  ApiResult<ApiReply> start(const ApiRequest& request, std::string_view id);
  ApiResult<ApiReply> stop(const ApiRequest& request, std::string_view id);
  ApiResult<ApiReply> replace_labels(const ApiRequest& request, std::string_view id);
  ApiResult<ApiReply> set_interval(const ApiRequest& request, std::string_view id,
                                   std::string_view which, std::string_view minutes);
  ApiResult<ApiReply> toolbox_proxy_url(const ApiRequest& request, std::string_view id);

  ApiResult<ApiReply> execute(const ApiRequest& request, const Record& sandbox);
  ApiResult<ApiReply> upload(const ApiRequest& request, const Record& sandbox);
  ApiResult<ApiReply> bulk_download(const ApiRequest& request, const Record& sandbox);
  ApiResult<ApiReply> download(const ApiRequest& request, const Record& sandbox);
  ApiResult<ApiReply> list_files(const ApiRequest& request, const Record& sandbox);
  ApiResult<ApiReply> delete_file(const ApiRequest& request, const Record& sandbox);
  ApiResult<ApiReply> create_folder(const ApiRequest& request, const Record& sandbox);

  // A small command in the sandbox (argv, no shell of the caller's making) for the file
  // operations the provider has no call for; its exit code and output.
  ApiResult<sandbox::ExecResult> run(const Record& sandbox, std::vector<std::string> argv);
  // The Sandbox object of the main API (`full`: with env, as GET answers; else a list item).
  nlohmann::json sandbox_json(const ApiRequest& request, const Record& record, bool full) const;

  Services services_;
};

}  // namespace quarry::server::daytona
