#include "reference_numbers.h"

#include <gtest/gtest.h>

#include <cmath>
#include <sstream>

#include "data/connection.h"
#include "postgres_environment.h"

namespace quarry::testing {

std::map<std::string, std::vector<double>> parse_table(const std::string& text) {
  std::map<std::string, std::vector<double>> table;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream fields(line);
    std::string name, field;
    if (!std::getline(fields, name, '\t')) continue;
    std::vector<double> numbers;
    while (std::getline(fields, field, '\t'))
      numbers.push_back(std::stod(field));
    if (!numbers.empty()) table[name] = numbers;
  }
  return table;
}

std::map<std::string, std::vector<double>> sql_table(const std::string& sql) {
  auto connection = data::Connection::open(PostgresEnvironment::get().server().admin_conninfo);
  EXPECT_TRUE(connection) << connection.error().message;
  auto result = connection->exec("SET statement_timeout = 0");
  result = connection->exec(sql);
  EXPECT_TRUE(result) << result.error().message;
  std::map<std::string, std::vector<double>> table;
  for (int row = 0; row < PQntuples(result->get()); ++row) {
    std::vector<double> numbers;
    for (int column = 1; column < PQnfields(result->get()); ++column) {
      numbers.push_back(std::stod(PQgetvalue(result->get(), row, column)));
    }
    table[PQgetvalue(result->get(), row, 0)] = numbers;
  }
  return table;
}

void expect_same_numbers(const std::map<std::string, std::vector<double>>& reported,
                         const std::map<std::string, std::vector<double>>& expected) {
  ASSERT_EQ(reported.size(), expected.size());
  for (const auto& [name, numbers] : expected) {
    SCOPED_TRACE(name);
    auto found = reported.find(name);
    ASSERT_NE(found, reported.end());
    ASSERT_EQ(found->second.size(), numbers.size());
    for (size_t i = 0; i < numbers.size(); ++i) {
      EXPECT_NEAR(found->second[i], numbers[i], 1e-3 + 1e-9 * std::fabs(numbers[i]));
    }
  }
}

}  // namespace quarry::testing
