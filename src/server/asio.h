// Boost.Asio and Boost.Beast for the server, with the names the server's files use.
#pragma once

// Boost 1.74's awaitable.hpp uses std::exchange without including <utility>.
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <string_view>
#include <utility>

namespace quarry::server {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

// Beast 1.74 speaks boost::string_view; the rest of quarry std::string_view.
inline std::string_view to_std(beast::string_view text) {
  return {text.data(), text.size()};
}
inline beast::string_view to_beast(std::string_view text) {
  return {text.data(), text.size()};
}

}  // namespace quarry::server
