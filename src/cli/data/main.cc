// quarry-data: quarry's command line (cli/commands.h) with the data room linked, so it runs
// db, ask and serve itself. `quarry` execs it, beside it, for those commands with the same
// arguments; it runs every other command too.
#include "cli/data/data_room.h"

int main(int argc, char** argv) {
  quarry::cli::DataRoom data_room;
  return quarry::cli::run(argc, argv, data_room);
}
