// fmt's compiled part, built once. Debian ships fmt as headers and a shared library, and quarry
// links no shared library but libc (cmake/Archives.cmake); built header-only, these
// definitions were compiled again in every file that formats (most of the compile time of a
// small file: common/error.cc took 4.2 s, 0.7 s without them). Here they come from the headers
// Debian ships: format-inl.h's functions (not inline without FMT_HEADER_ONLY), and the
// instantiations format.h declares extern or leaves to be made here (the locale's, which
// fmt/chrono.h uses).
#include <fmt/format-inl.h>

FMT_BEGIN_NAMESPACE
namespace detail {

template FMT_API locale_ref::locale_ref(const std::locale& loc);
template FMT_API auto locale_ref::get<std::locale>() const -> std::locale;
template FMT_API auto thousands_sep_impl<char>(locale_ref) -> thousands_sep_result<char>;
template FMT_API auto thousands_sep_impl<wchar_t>(locale_ref) -> thousands_sep_result<wchar_t>;
template FMT_API auto decimal_point_impl(locale_ref) -> char;
template FMT_API auto decimal_point_impl(locale_ref) -> wchar_t;

}  // namespace detail
FMT_END_NAMESPACE
