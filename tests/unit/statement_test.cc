#include "data/statement.h"

#include <gtest/gtest.h>

namespace quarry::data {
namespace {

TEST(TrimStatement, KeepsTheStatementAndDropsWhatSurroundsIt) {
  struct Case {
    std::string_view sql;
    std::string_view expected;
  } cases[] = {
      {"SELECT 1", "SELECT 1"},
      {"  SELECT 1 ;; \n", "SELECT 1"},
      {"SELECT 1; -- done", "SELECT 1"},
      {"SELECT 1 -- no semicolon, a comment to the end", "SELECT 1"},
      {"SELECT 1; /* a /* nested */ comment */ ;", "SELECT 1"},
      {"-- peak views\nSELECT 1;\n", "SELECT 1"},
      {"SELECT a -- inside\n  FROM t;", "SELECT a -- inside\n  FROM t"},
      {"SELECT ';--' AS s;", "SELECT ';--' AS s"},
      {"SELECT 'it''s';", "SELECT 'it''s'"},
      {"SELECT E'a\\';b';", "SELECT E'a\\';b'"},
      {"SELECT \"odd;--name\" FROM t;", "SELECT \"odd;--name\" FROM t"},
      {"SELECT $$;--$$, $tag$ $$ ; $tag$;", "SELECT $$;--$$, $tag$ $$ ; $tag$"},
      {"SELECT $1::int, a$b$ FROM t;", "SELECT $1::int, a$b$ FROM t"},
      {"SELECT 'unterminated ; -- ", "SELECT 'unterminated ; -- "},
      {"", ""},
      {" ; -- only a comment\n", ""},
  };
  for (const auto& c : cases) {
    EXPECT_EQ(trim_statement(c.sql), c.expected) << c.sql;
  }
}

}  // namespace
}  // namespace quarry::data
