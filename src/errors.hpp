// Error texts and names; the count of refused state transitions (errors.cpp).
#pragma once
#include "state.hpp"

namespace ibmsg {

// Counts transitions the state table refused: each one is a bug (tests check it stays 0).
void note_invalid_transition(State from, Event ev);
unsigned long invalid_transitions();
const char *error_text(int code);
const char *error_name(int code);

}  // namespace ibmsg
