#include "volt/options/run_main.h"

#include <CLI/CLI.hpp>
#include <iostream>

#include "volt/core/error.h"

namespace volt {

int run_main(const std::function<int()>& body, const ForeignErrorDescriber& describe_foreign) {
  try {
    return body();
  } catch (const Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return kExitBadInput;
  } catch (const CLI::ParseError& e) {
    // A program that parses with app.exit(e) prints --help itself; one that lets the error
    // escape still ends with the usage code.
    if (e.get_exit_code() == 0) return 0;
    std::cerr << "error: " << e.what() << "\nHINT: run with --help for the flags.\n";
    return kExitUsage;
  } catch (const InternalError& e) {
    std::cerr << e.what() << "\n";
    return kExitInternalError;
  } catch (const std::exception& e) {
    const std::optional<std::string> described = describe_foreign ? describe_foreign(e) : std::nullopt;
    std::cerr << "error: " << described.value_or(e.what()) << "\n";
    return kExitInternalError;
  }
}

}  // namespace volt
