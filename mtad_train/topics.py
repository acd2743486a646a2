"""Hand-written word lists for the templated half of the distillation prompt pool.

Nothing here is taken from an evaluation set; :mod:`mtad_train.overlap` checks that the pool
built from these lists shares no 8-gram with any evaluation prompt.
"""

GENERAL_TOPICS = """
a lighthouse keeper|a forgotten library|the first day of school|a robot learning to paint|a city
garden on a rooftop|a long train journey|an old family recipe|the last bookstore in town|a storm
at sea|a friendship between a cat and a crow|moving to a new country|a lost umbrella|a small
bakery|a mountain village in winter|a chess tournament|a volunteer firefighter|an abandoned
amusement park|a violin teacher|the night market|a desert expedition|a time capsule|a broken
clock|a quiet neighbour|a school science fair|a summer thunderstorm|a retired astronaut|a
marathon runner|a hidden waterfall|a street musician|a secret recipe book|a snowed-in cabin|a
beekeeper|a museum at night|an island ferry|a family road trip|a community orchestra|a coral
reef|the invention of the printing press|an elderly gardener|a new puppy|a late-night diner|a
ghost town|a village festival|a canoe trip|a sandcastle contest|a rainy Monday|a kite flying
competition|a wooden sailboat|a clockmaker's shop|a power outage|a first job interview|a
wildlife photographer|a hot air balloon ride|a night sky full of stars|a train station
cafe|a stray dog|an inventor's workshop|a weekend farmers market|a pottery class|a paper
airplane|a hiking trail|a forgotten letter|a bicycle repair shop|a swimming lesson|a family
reunion|a message in a bottle|a tree house|a theatre rehearsal|a spelling bee|a cooking
competition|a camping trip|a library card|a school bus driver|a chess-playing grandmother|a
fishing village|the northern lights|a city at dawn|an old map|a music box|a lonely
astronaut|a dragon who is afraid of heights|a talking parrot|a shy giant|a magic paintbrush|a
detective who cannot smell|a baker who bakes at midnight|a vending machine with feelings|a
tiny dragon|a haunted lighthouse|a lost glove|a penguin in the desert|a scarecrow|a snow
leopard|a river that flows uphill|a shoemaker|a dream journal|a typewriter|a chess set|a
city of bridges|a cloud that cannot rain|a whale song|a seed vault|an underground city
""".replace("\n", " ").split("|")

CONCEPTS = """
photosynthesis|black holes|the water cycle|plate tectonics|the immune system|inflation in
economics|supply and demand|compound interest|machine learning|neural networks|blockchain|public
key cryptography|the greenhouse effect|natural selection|DNA replication|the theory of
relativity|quantum entanglement|the Doppler effect|entropy|the Pythagorean theorem|prime
numbers|the central limit theorem|Bayes' theorem|the scientific method|vaccines|antibiotic
resistance|climate change|renewable energy|nuclear fission|nuclear fusion|the stock market|the
Industrial Revolution|the Renaissance|democracy|the separation of powers|the French
Revolution|the Silk Road|the Roman Empire|the printing press|the Cold War|globalization|the
internet|how search engines work|how a compiler works|operating systems|virtual memory|garbage
collection|recursion|dynamic programming|sorting algorithms|binary search|hash tables|linked
lists|graph algorithms|big O notation|version control|unit testing|object-oriented
programming|functional programming|databases and indexing|TCP/IP|HTTP|encryption|cloud
computing|containers|electric cars|batteries|solar panels|wind turbines|the human heart|the
nervous system|sleep|memory and learning|the placebo effect|cognitive biases|opportunity
cost|game theory|the tragedy of the commons|comparative advantage|exchange rates|interest
rates|photosynthesis in algae|ocean currents|volcanoes|earthquakes|hurricanes|the
seasons|the phases of the moon|gravity|magnetism|electric circuits|semiconductors|lasers|the
periodic table|chemical bonds|acids and bases|catalysts|enzymes|evolution of whales|the
history of writing|the history of mathematics|impressionist painting|baroque music|jazz|the
novel as a literary form|Greek tragedy|Shakespeare's sonnets|stoic philosophy|utilitarianism|
existentialism|the social contract|human rights|urbanization|migration|biodiversity|
deforestation|coral bleaching|soil erosion|water purification|recycling|composting|nutrition|
exercise and health|meditation|time management|public speaking|negotiation|leadership|
teamwork|remote work|personal finance|budgeting|investing in index funds|credit scores|
""".replace("\n", " ").split("|")

FORMS = [
    "short story",
    "poem",
    "blog post",
    "persuasive essay",
    "short essay",
    "news article",
    "diary entry",
    "letter",
    "speech",
    "product description",
    "limerick",
    "haiku sequence",
    "fairy tale",
    "dialogue",
    "travel guide",
    "review",
    "opinion piece",
    "advertisement",
    "motivational message",
    "set of instructions",
    "recipe",
    "newsletter",
    "cover letter",
]
AUDIENCES = [
    "a ten-year-old",
    "a beginner",
    "a busy executive",
    "a high school student",
    "a grandparent",
    "an expert",
    "a new employee",
    "a tourist",
    "a software engineer",
    "a teacher",
    "a college freshman",
    "a small business owner",
]
STYLES = [
    "humorous",
    "formal",
    "friendly",
    "dramatic",
    "concise",
    "poetic",
    "optimistic",
    "suspenseful",
    "whimsical",
    "serious",
    "nostalgic",
    "inspiring",
]
PERSONAS = [
    "a pirate captain",
    "a medieval knight",
    "a travel agent",
    "a personal trainer",
    "a detective",
    "a museum guide",
    "a chef",
    "a startup founder",
    "a wise old wizard",
    "a customer support agent",
    "a sports commentator",
    "a park ranger",
    "a librarian",
    "a fitness coach",
    "a history professor",
    "a career counselor",
    "a spaceship pilot",
    "a gardener",
    "a tour guide in Rome",
    "a robot butler",
    "a stand-up comedian",
    "a nutritionist",
    "a marine biologist",
    "a film critic",
    "a math tutor",
    "a poet",
]
NAMES = [
    "Alice",
    "Bob",
    "Carlos",
    "Dana",
    "Emeka",
    "Fatima",
    "Grace",
    "Hiro",
    "Ines",
    "Jonas",
    "Kira",
    "Liam",
    "Maya",
    "Noah",
    "Olga",
    "Priya",
    "Quinn",
    "Rosa",
    "Sami",
    "Tara",
    "Uma",
    "Victor",
    "Wen",
    "Xavier",
    "Yara",
    "Zane",
]
ITEMS = [
    "apples",
    "marbles",
    "books",
    "pencils",
    "stickers",
    "coins",
    "cookies",
    "cards",
    "shells",
    "stamps",
    "oranges",
    "balloons",
    "tickets",
    "candles",
    "buttons",
]
PLACES = [
    "Kyoto",
    "Lisbon",
    "Patagonia",
    "Iceland",
    "Marrakech",
    "Vancouver",
    "the Scottish Highlands",
    "Cape Town",
    "Hanoi",
    "Istanbul",
    "Prague",
    "New Zealand",
    "the Amazon rainforest",
    "Santorini",
    "Montreal",
    "Oaxaca",
    "Norway's fjords",
    "Bali",
    "Havana",
    "Edinburgh",
]
HISTORY = [
    "the invention of the steam engine",
    "the fall of the Berlin Wall",
    "the moon landing",
    "the Black Death",
    "the printing press",
    "the Meiji Restoration",
    "the Magna Carta",
    "the abolition of slavery",
    "the invention of the telephone",
    "the discovery of penicillin",
    "the spread of railways",
    "the women's suffrage movement",
    "the Green Revolution",
    "the invention of the transistor",
    "the founding of the United Nations",
    "the Age of Exploration",
    "the Protestant Reformation",
    "the Enlightenment",
    "the invention of photography",
    "the rise of social media",
]
DOMAINS = [
    "society",
    "the economy",
    "science",
    "art",
    "education",
    "politics",
    "daily life",
    "technology",
    "medicine",
    "international trade",
    "culture",
    "the environment",
]

CODE_TASKS = """
reverses a string|checks whether a number is prime|computes the factorial of n|returns the n-th
Fibonacci number|removes duplicates from a list while keeping order|counts the vowels in a
string|merges two sorted lists|flattens a nested list|finds the most common word in a text|
checks whether two strings are anagrams|converts Celsius to Fahrenheit|computes the greatest
common divisor of two integers|returns all permutations of a list|validates an email address
with a regular expression|reads a CSV file and returns the average of a column|parses a date
string in ISO format|sorts a list of dictionaries by a given key|implements binary search|
implements bubble sort|implements quicksort|implements merge sort|computes the median of a list|
transposes a matrix|multiplies two matrices|checks for balanced parentheses|converts a decimal
number to binary|converts a Roman numeral to an integer|converts an integer to a Roman numeral|
finds the longest common prefix of a list of strings|computes the running sum of a list|
groups words by their first letter|counts the frequency of each character|capitalizes every
word in a sentence|rotates a list by k positions|finds the second largest number in a list|
chunks a list into pieces of size n|computes the dot product of two vectors|checks whether a
year is a leap year|generates the first n prime numbers|computes the sum of digits of a number|
finds all pairs in a list that sum to a target|returns the intersection of two lists|
implements a stack class|implements a queue using two stacks|implements a linked list class|
implements an LRU cache|computes the Levenshtein distance between two strings|finds the
longest increasing subsequence|solves the knapsack problem with dynamic programming|performs a
breadth-first search on a graph|performs a depth-first search on a graph|finds the shortest
path with Dijkstra's algorithm|detects a cycle in a directed graph|serializes a binary tree|
computes the height of a binary tree|checks whether a binary tree is balanced|counts the words
in a file|downloads nothing but simulates a retry loop with exponential backoff|memoizes a
function with a decorator|times a function with a decorator|reads a JSON file and prints its
keys|writes a list of rows to a CSV file|splits a text into sentences|computes a moving
average|normalizes a list of numbers to the range 0 to 1|finds the mode of a list|computes the
standard deviation|generates a random password|checks whether a string is a palindrome|
compresses a string with run-length encoding|decodes a run-length encoded string|converts
snake_case to camelCase|parses command-line arguments|implements a simple tokenizer|evaluates
a postfix expression|implements a binary heap|implements a trie|counts islands in a grid|
rotates a square matrix by 90 degrees|finds the missing number in a sequence|checks whether
a Sudoku board is valid|computes the power set of a set|computes the Collatz sequence|
simulates rolling two dice|implements the sieve of Eratosthenes|formats a number with thousands
separators|converts a dictionary to a query string|merges two dictionaries|inverts a
dictionary|finds the key with the largest value in a dictionary|zips two lists into a
dictionary|counts lines of code in a directory|implements a countdown timer|implements FizzBuzz
""".replace("\n", " ").split("|")

LANGUAGES = [
    "Python",
    "Python",
    "Python",
    "Python",
    "JavaScript",
    "C++",
    "Java",
    "Rust",
    "Go",
    "C",
    "TypeScript",
    "Bash",
]
